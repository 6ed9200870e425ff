"""``sglab run --timings``: per-cell wall times grouped into the notebook's ``##`` sections, adding
up to the notebook's wall time, saved as a ``workbook`` run; the report and 00 read live times from
recorded records."""

import json
import re
from pathlib import Path

import nbformat
import pytest

from sglab.tools import cli, report, run_cmd
from sglab.core import runs
from sglab.tools.report import run_notebooks
from sglab.tools import timings


@pytest.fixture
def tiny(tmp_path) -> Path:
    nb = nbformat.v4.new_notebook()
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    nb.cells = [
        md("# Tiny\n\nNo section yet."),
        code("MODE = 'recorded'"),
        md("## Load the data"),
        code("import time\ntime.sleep(0.6)"),
        code("x = 1"),
        md("Some words, no heading."),
        code("y = 2"),
        md("## Plot"),
        code("time.sleep(0.3)", metadata={"tags": ["phase:plotting"]}),
        code("print('done')")
    ]
    path = tmp_path / "nb" / "99_tiny.ipynb"
    path.parent.mkdir()
    nbformat.write(nb, path)
    return path


def _run(tiny, tmp_path):
    return run_notebooks([tiny], tmp_path / "report", html_pages=False, env_rows=[],
                         progress=lambda *_: None)


def test_phases_add_up_to_the_notebook(tiny, tmp_path, data_root):
    (r,) = _run(tiny, tmp_path)
    assert r.status == "ok", r.error
    df = timings.frame([r])
    table = timings.phase_table(df)
    assert list(table["phase"]) == [
        "setup", "Load the data", "plotting", "Plot", timings.KERNEL_PHASE
    ]
    secs = dict(zip(table["phase"], table["seconds"]))
    assert secs["Load the data"] >= 0.6 and secs["plotting"] >= 0.3
    assert df["value"].sum() == pytest.approx(r.seconds, abs=0.01)
    assert set(df["cell"]) == {1, 3, 4, 6, 8, 9, -1}
    text = timings.summary(df)
    # the total printed is the phases' sum, which the line above holds to the notebook's wall time
    # (printed from r.seconds itself it could round the other way: 1.649 against 1.651)
    assert text.startswith(f"99_tiny (cpu): {df['value'].sum():.1f} s") and "Load the data" in text


def test_record_and_live_times(tiny, tmp_path, data_root):
    results = _run(tiny, tmp_path)
    path = timings.write(results, record=True, params={"notebooks": ["99_tiny"]})
    assert path.parent == data_root / "recorded" / "workbook"
    run = runs.read_run(path)
    assert run.manifest.experiment == "workbook" and run.manifest.method_version == 1
    assert run.manifest.notebooks["99_tiny"]["status"] == "ok"
    assert timings.live_times() == {}  # a CPU record in recorded mode is no live time
    # the same record as a GPU box would write it: the notebook live, on an H100
    gpu = path.with_name("20990101T000000Z_nvidia-h100-x1.csv")
    df = run.df.assign(mode="live")
    df.to_csv(gpu, index=False)
    gpu.with_suffix(".json").write_text(
        json.dumps({
            **run.manifest.raw, "gpu_name": "NVIDIA H100 80GB HBM3", "gpu_count": 1,
            "created_utc": "2099-01-01T00:00:00Z"
        }))
    expected = df.loc[df["metric"] == "wall_s", "value"].sum()
    # the sum as read back from the CSV, to one decimal (at x.x5 the two sums may round apart)
    (got,) = timings.live_times().items()
    assert got[0] == "99_tiny" and re.fullmatch(r"H100 ×1: \d+\.\d s", got[1])
    assert float(got[1].split(": ")[1][:-2]) == pytest.approx(expected, abs=0.05 + 1e-9)


def test_cli_run_timings(tiny, tmp_path, data_root, monkeypatch, capsys):
    monkeypatch.setattr(run_cmd, "_resolve_notebooks", lambda names: [tiny])
    monkeypatch.setattr(report, "env_report", lambda: [("GPUs", "0")])
    assert cli.main(["run", "--timings", "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "99_tiny (cpu):" in out and "Load the data" in out
    assert "(1 at a time; " in out  # one notebook runs alone, whatever --jobs allows
    saved = list((data_root / "runs" / "workbook").glob("*.csv"))
    assert len(saved) == 1 and f"timings: {saved[0]}" in out
    assert cli.main(["run", "--timings", "--record", "--out", str(tmp_path / "r")]) == 0
    assert len(list((data_root / "recorded" / "workbook").glob("*.csv"))) == 1
    assert (tmp_path / "r" / "index.html").exists()
    assert cli.main(["run", "--record"]) == 2


def test_failed_notebook_is_not_recorded(tiny, tmp_path, data_root, monkeypatch, capsys):
    nb = nbformat.read(tiny, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("raise RuntimeError('x')"))
    nbformat.write(nb, tiny)
    monkeypatch.setattr(run_cmd, "_resolve_notebooks", lambda names: [tiny])
    monkeypatch.setattr(report, "env_report", lambda: [])
    assert cli.main(["run", "--timings", "--record", "--out", str(tmp_path / "r")]) == 1
    assert "not recorded" in capsys.readouterr().out
    assert not (data_root / "recorded" / "workbook").exists()
    assert len(list((data_root / "runs" / "workbook").glob("*.csv"))) == 1


def test_committed_records_load():
    """Every committed workbook record reads back with its notebooks' live times."""
    for run in runs.load_all_recorded("workbook"):
        assert set(run.df["metric"]) <= {"wall_s", "measure_s"}
        assert timings.live_seconds(run) or run.manifest.gpu_name == "cpu"


def test_two_at_a_time_keeps_order_and_reports_each(tiny, tmp_path):
    """Recorded mode runs notebooks in worker processes: results come back in the order asked, each
    with its executed copy and page, and a failing notebook is reported as failed without stopping
    the other."""
    bad = tiny.parent / "98_bad.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("MODE = 'recorded'"), nbformat.v4.new_code_cell("1 / 0")]
    nbformat.write(nb, bad)
    said = []
    out = tmp_path / "report"
    results = run_notebooks([tiny, bad], out, env_rows=[], progress=said.append, jobs=2)
    assert [r.path.name for r in results] == ["99_tiny.ipynb", "98_bad.ipynb"]
    assert [r.status for r in results] == ["ok", "failed"]
    assert "ZeroDivisionError" in results[1].error
    assert said[0] == "2 notebooks, 2 at a time …"
    for stem in ("99_tiny", "98_bad"):
        assert (out / f"{stem}.ipynb").exists() and (out / f"{stem}.html").exists()
    assert (out / "index.html").exists()


def test_a_dead_worker_is_a_failed_notebook_not_a_lost_run(tiny, tmp_path):
    """A worker killed outright (here by its own notebook's kernel) fails its notebook, not the
    run: the other notebooks report, the orphaned kernel is stopped, and the folder of its sockets
    goes with the run's."""
    import os
    import tempfile
    import time

    kernels = lambda: set(Path(tempfile.gettempdir()).glob("sglab-kernel-*"))  # noqa: E731
    before = kernels()

    marker = tmp_path / "kernel.pid"
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(f"import os, signal, time\nopen({str(marker)!r}, 'w')"
                                  ".write(str(os.getpid()))\ntime.sleep(1.5)\n"
                                  "os.kill(os.getppid(), signal.SIGKILL)\ntime.sleep(60)")
    ]
    killer = tiny.parent / "97_killer.ipynb"
    nbformat.write(nb, killer)
    results = run_notebooks([killer, tiny], tmp_path / "report", env_rows=[], jobs=2,
                            progress=lambda *_: None)
    assert [r.status for r in results] == ["failed", "ok"] and not results.signal
    assert results[0].error == "the worker process running it died (killed by signal 9)"
    kernel = int(marker.read_text())
    for _ in range(50):
        if not os.path.exists(f"/proc/{kernel}") or " Z " in open(f"/proc/{kernel}/stat").read():
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the dead worker's kernel {kernel} is still running")
    assert (tmp_path / "report" / "index.html").exists()
    assert not kernels() - before


def _stamp(t: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_timings_of_notebooks_run_elsewhere_carry_that_machine(tmp_path, data_root, capsys):
    """`sglab timings REPORTS --runs RUNS --record`: the cells' times from the executed notebook,
    the measurement phases and the machine (GPU, count, driver, commit) from the live run it wrote
    there, the date when it ran; a notebook an earlier run into the folder left in the index is not
    timed; a run from another machine beside it is refused."""
    import os
    import time

    import pandas as pd

    from sglab.tools.fixes import by_stem

    t0 = time.time() - 3600
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("MODE = 'live'"),
        nbformat.v4.new_markdown_cell("## Go"),
        nbformat.v4.new_code_cell("run = measure()")
    ]
    for cell, (a, b) in zip([nb.cells[0], nb.cells[2]], [(0.5, 0.6), (1.0, 13.0)]):
        cell.metadata["execution"] = {
            "iopub.status.busy": _stamp(t0 + a), "iopub.status.idle": _stamp(t0 + b)
        }
    reports = tmp_path / "reports"
    reports.mkdir()
    nbformat.write(nb, reports / "06_capture_sizes.ipynb")
    # 05 ran (and failed) in an earlier run into the folder, which the index kept: not timed here
    nbformat.write(nb, reports / "05_grid_thw.ipynb")
    (reports / "index.json").write_text(
        json.dumps([{
            "notebook": "05_grid_thw.ipynb", "status": "failed", "mode": "live", "seconds": 40.0,
            "error": "", "run_utc": "2026-01-01T00:00:00.000000Z"
        }, {
            "notebook": "06_capture_sizes.ipynb", "status": "ok", "mode": "live", "seconds": 15.0,
            "error": "", "run_utc": "2026-01-02T00:00:00.000000Z"
        }]))
    exp = by_stem("06_capture_sizes").experiment
    there = {
        "gpu_name": "NVIDIA H200", "gpu_count": 2, "gpu_count_machine": 4, "driver": "580",
        "gpu_memory_mib": 143771, "cuda": "13.0", "torch": "2.11.0+cu130", "python": "3.12.3",
        "platform": "linux", "git_sha": "abc1234", "phases_s": {"ranks": 7.0}
    }
    folder = tmp_path / "runs" / exp
    folder.mkdir(parents=True)
    pd.DataFrame([{"experiment": exp, "variant": "a", "metric": "m", "value": 1.0,
                   "unit": "s"}]).to_csv(folder / "r.csv", index=False)
    (folder / "r.json").write_text(json.dumps({"experiment": exp, **there}))
    for f in folder.iterdir():
        os.utime(f, (t0 + 5, t0 + 5))
    assert cli.main(["timings", str(reports), "--runs", str(tmp_path / "runs"), "--record"]) == 0
    (rec,) = runs.load_all_recorded(timings.EXPERIMENT)
    m = rec.manifest
    assert (m.gpu_name, m.gpu_count, m.git_sha) == ("NVIDIA H200", 2, "abc1234")
    assert m.created_utc == _stamp(t0)[:19] + "Z"  # first cell's start, less the kernel's 0.5 s
    assert timings.live_seconds(rec) == {"06_capture_sizes": pytest.approx(15.0)}
    inner = rec.df[rec.df.metric == "measure_s"]
    assert list(inner.phase) == ["measure: ranks"] and list(inner.value) == [7.0]
    # a second live run from another machine in the same window: which machine is unknowable
    (folder / "s.json").write_text(json.dumps({"experiment": exp, **there, "gpu_count": 4}))
    (folder / "s.csv").write_bytes((folder / "r.csv").read_bytes())
    for f in folder.iterdir():
        os.utime(f, (t0 + 5, t0 + 5))
    capsys.readouterr()
    assert cli.main(["timings", str(reports), "--runs", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sglab timings: ") and "2 machines" in err and "\n" not in err
