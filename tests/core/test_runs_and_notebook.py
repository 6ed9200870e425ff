"""sglab.core.runs (tidy frames, atomic writes, manifests, recorded lookup), sglab.sglang.upstream,
sglab.core.notebook modes, sglab.core.hardware on the CPU, and the CLI's argument handling."""

import json
from pathlib import Path

import pandas as pd
import pytest

from sglab.tools import cli, report
from sglab.core import hardware, runs, text
from sglab.sglang import upstream
from sglab.core import notebook as nb


def _frame():
    return runs.tidy("demo", [
        {"variant": "before", "tokens": 16, "metric": "time_median", "value": 2.0, "unit": "ms"},
        {"variant": "after", "tokens": 16, "metric": "time_median", "value": 1.0, "unit": "ms"},
    ])


def test_tidy_orders_columns_and_validates():
    df = _frame()
    assert list(df.columns) == ["experiment", "variant", "tokens", "metric", "value", "unit"]
    with pytest.raises(ValueError, match="lacks"):
        runs.tidy("demo", [{"variant": "x", "metric": "m", "value": 1}])
    with pytest.raises(ValueError):
        runs.tidy("demo", [])


def test_write_run_writes_csv_and_manifest(data_root):
    path = runs.write_run(_frame(), experiment="demo", method_version=3, params={"world_size": 2})
    assert path.parent == data_root / "runs" / "demo"
    manifest = json.loads(path.with_suffix(".json").read_text())
    for key in ("experiment", "method_version", "created_utc", "git_sha", "gpu_name", "gpu_count",
                "driver", "cuda", "torch", "python", "params"):
        assert key in manifest, key
    assert manifest["method_version"] == 3 and manifest["params"] == {"world_size": 2}
    assert manifest["gpu_count"] == (hardware.gpu_count() if hardware.has_cuda() else 0)
    assert not list(path.parent.glob(".tmp-*"))
    assert pd.read_csv(path).equals(_frame())
    with pytest.raises(ValueError, match="expected 'other'"):
        runs.write_run(_frame(), experiment="other", method_version=1, params={})


def test_load_all_recorded_oldest_first(data_root):
    rec = data_root / "recorded"
    p2 = runs.write_run(_frame(), experiment="demo", method_version=1, params={"world_size": 2},
                        root=rec)
    p4 = runs.write_run(_frame(), experiment="demo", method_version=1, params={"world_size": 4},
                        root=rec)
    assert [r.path for r in runs.load_all_recorded("demo")] == [p2, p4]
    assert runs.load_all_recorded("missing") == []
    (rec / "demo" / "orphan.csv").write_text("x\n")  # no manifest: ignored
    assert len(runs.load_all_recorded("demo")) == 2


def test_promote_copies_run_into_recorded(data_root):
    live = runs.write_run(_frame(), experiment="demo", method_version=1, params={})
    dest = runs.promote(live)
    assert dest.parent == data_root / "recorded" / "demo" and dest.with_suffix(".json").exists()


def _demo_claims():
    import types

    mod = types.ModuleType("demo_claims")
    mod.EXPERIMENT, mod.GPUS, mod.CLAIM, mod.CLAIMS = "demo", 1, "demo", []
    mod.shown = lambda rs: rs[-1:]
    return mod


def test_workbook_modes_on_cpu(data_root, capsys):
    if hardware.has_cuda():
        pytest.skip("CPU-only behaviour")
    demo = _demo_claims()
    wb = nb.Workbook(demo, mode="auto")
    assert wb.live is False and wb.mode == "recorded"
    assert "no CUDA GPU here" in capsys.readouterr().out
    none = wb.run()
    assert isinstance(none, runs.NoRun) and not none and none.shown == []
    assert str(none).startswith("no GPU run to show (no recorded demo run yet")
    with pytest.raises(RuntimeError, match="not in live mode"):
        wb.measure(lambda: _frame(), params={}, method_version=1)
    with pytest.raises(RuntimeError, match="MODE='live'"):
        nb.Workbook(demo, mode="live")
    with pytest.raises(ValueError, match="MODE must be"):
        nb.Workbook(demo, mode="fast")
    runs.write_run(_frame(), experiment="demo", method_version=1, params={},
                   root=data_root / "recorded")
    got = nb.Workbook(demo, show=False).run()
    assert isinstance(got, runs.RunSet) and got and not got.first.live and len(got.shown) == 1
    assert got.first.df["value"].tolist() == [2.0, 1.0] and got.elsewhere == []
    assert nb.Workbook(experiment="cpu_only", gpus=0, show=False).live is True
    capsys.readouterr()
    nb.Workbook(experiment="cpu_only", gpus=0, mode="recorded")
    said = capsys.readouterr().out  # nothing of it is measured on a GPU: no GPU results to source
    assert "every cell runs on this machine" in said and "GPU results" not in said


def test_hardware_meets_on_cpu():
    assert hardware.meets(0) == (True, "needs no GPU")
    with pytest.raises(ValueError):
        hardware.meets(-1)
    if not hardware.has_cuda():
        ok, why = hardware.meets(1)
        assert not ok and "no CUDA GPU" in why


def test_upstream_checks_read_source_without_import(tmp_path, monkeypatch):
    pkg = tmp_path / "srt" / "models"
    pkg.mkdir(parents=True)
    (pkg / "demo.py").write_text("class Demo:\n    @property\n    def model(self): ...\n")
    from sglab.sglang.fix import Fix

    def _check(read):
        text = read("srt/models/demo.py")
        if text is None:
            return upstream.Verdict("unknown", "file missing")
        return upstream.Verdict("pr-era" if "def model" in text else "before", "demo property")

    def _broken(read):
        raise RuntimeError("no")

    demo = Fix("demo_check", "99", "demo property present", (1,), 0, _check)
    assert upstream.check(demo, root=tmp_path).status == "pr-era"
    assert upstream.check(demo, root=tmp_path / "nothing").status == "unknown"
    if upstream.installed() is None:
        assert upstream.check(demo).status == "not-installed"
    broken = Fix("broken", "99", "raises", (1,), 0, _broken)
    assert upstream.check(broken, root=tmp_path).status == "unknown"
    with pytest.raises(ValueError):
        upstream.Verdict("maybe", "not a state")


def test_cli_params_and_errors():
    from sglab.tools.commands import parse_params

    assert parse_params(["world_size=4", "name=abc",
                         "sizes=[1, 2]"]) == {"world_size": 4, "name": "abc", "sizes": [1, 2]}
    with pytest.raises(ValueError, match="NAME=VALUE"):
        parse_params(["oops"])
    assert cli.main(["record", "no_such_experiment"]) == 2
    items = dict(report.env_report())
    assert {"GPUs", "torch / CUDA", "NVML", "cuda-bindings", "nsight timing",
            "sglang"} <= set(items)


def test_newest_by_newest_and_gpu_short(data_root):
    rec = data_root / "recorded"
    for ws in (2, 4, 2):
        runs.write_run(_frame(), experiment="demo", method_version=1, params={"world_size": ws},
                       root=rec)
    all_runs = runs.load_all_recorded("demo")
    newest = runs.newest_by(all_runs, lambda r: r.manifest.params["world_size"])
    assert list(newest) == [2, 4] and newest[2].path == all_runs[-1].path
    shown = runs.newest(all_runs, lambda r: r.manifest.params["world_size"], reverse=True)
    assert [r.path for r in shown] == [newest[4].path, newest[2].path]
    assert runs.gpu_short({"gpu_name": "NVIDIA H100 80GB HBM3"}) == "H100"
    assert runs.gpu_short("NVIDIA H200") == "H200" and runs.gpu_short({}) == "?"


def test_cli_upstream_rejects_a_folder_that_is_not_sglang(tmp_path, capsys):
    assert cli.main(["upstream", "--root", str(tmp_path)]) == 2
    assert "not an SGLang package folder" in capsys.readouterr().err


def test_sidecars_are_written_listed_read_back_and_promoted(data_root, tmp_path):
    events = pd.DataFrame({
        "lane": ["host"], "name": ["phase::replay"], "category": ["range"], "start_us": [0.0],
        "dur_us": [5.0], "phase": ["replay"]
    })
    trace_file = tmp_path / "x.trace.json.gz"
    trace_file.write_bytes(b"\x1f\x8b fake")
    path = runs.write_run(_frame(), experiment="demo", method_version=1, params={},
                          sidecars={"events": events, "trace": trace_file})
    run = runs.read_run(path)
    assert run.manifest.sidecars == {
        "events": f"{path.stem}.events.csv.gz", "trace": f"{path.stem}.trace.json.gz"
    }
    assert run.sidecar("events").equals(events)
    assert run.sidecar("trace").read_bytes() == trace_file.read_bytes()
    assert run.sidecar("missing") is None
    assert runs.list_runs("demo", kind="runs") == [path]  # a sidecar is never taken for a run
    dest = runs.promote(path)
    assert runs.read_run(dest).sidecar("events").equals(events)
    with pytest.raises(ValueError, match="lower-case"):
        runs.write_run(_frame(), experiment="demo", method_version=1, params={},
                       sidecars={"Bad Name": events})


def test_a_measurements_temporary_files_go_once_its_run_is_written(data_root, monkeypatch):
    """What a measurement writes in the temporary folder (a trace it hands over as a sidecar,
    what its children leave) is gone once the run is written, its sidecar kept in the run; the
    process's temporary folder is the same after as before, and so is a failing one's."""
    import os
    import subprocess
    import sys
    import tempfile

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    before, env = tempfile.gettempdir(), os.environ.get("TMPDIR")
    made = []

    def fn():
        folder = Path(tempfile.mkdtemp(prefix="trace-"))
        made.append(folder)
        (folder / "x.trace.json.gz").write_bytes(b"\x1f\x8b fake")
        child = subprocess.run([sys.executable, "-c", "import tempfile; print(tempfile.mkdtemp())"],
                               capture_output=True, text=True, check=True).stdout.strip()
        made.append(Path(child))
        return runs.Measured(_frame(), sidecars={"trace": folder / "x.trace.json.gz"})

    path, _ = runs.measure(fn, experiment="demo", method_version=1, params={})
    assert runs.read_run(path).sidecar("trace").read_bytes() == b"\x1f\x8b fake"
    assert made and not any(p.exists() for p in made)
    assert (tempfile.gettempdir(), os.environ.get("TMPDIR")) == (before, env)
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ
    with pytest.raises(RuntimeError):
        runs.measure(lambda: made.append(Path(tempfile.mkdtemp())) or _boom(), experiment="demo",
                     method_version=1, params={})
    assert not made[-1].exists() and tempfile.gettempdir() == before


def _boom():
    raise RuntimeError("the measurement failed")


def test_a_sidecar_reads_an_empty_label_back_as_empty_and_groups_it(data_root):
    # pandas 3 reads text columns as its string dtype, pandas 2 as object: either way an empty
    # label is "" again, so that groupby keeps its rows
    kernels = pd.DataFrame({
        "scope": ["", "decode", ""], "name": ["copy", "attn", "norm"], "calls": [2, 3, 4]
    })
    path = runs.write_run(_frame(), experiment="demo", method_version=1, params={},
                          sidecars={"eager_kernels": kernels})
    back = runs.read_run(path).sidecar("eager_kernels")
    assert list(back["scope"]) == ["", "decode", ""]
    assert back.groupby("scope")["calls"].sum().to_dict() == {"": 6, "decode": 3}
    assert back["calls"].tolist() == [2, 3, 4]  # numbers stay numbers


def test_recorded_sidecars_keep_no_missing_labels():
    found = 0
    for experiment in sorted(p.name for p in runs.data_dir("recorded").iterdir() if p.is_dir()):
        for run in runs.load_all_recorded(experiment):
            for name, fname in run.manifest.sidecars.items():
                if not fname.endswith(".csv.gz"):
                    continue
                df = run.sidecar(name)
                found += 1
                text = [c for c, t in df.dtypes.items() if not pd.api.types.is_numeric_dtype(t)]
                assert not df[text].isna().any().any(), (run.path.name, name)
    assert found


def test_explore_falls_back_to_a_static_table_headless(monkeypatch, capsys):
    import pandas as pd

    from sglab.core.notebook import explore

    monkeypatch.setenv("SGLAB_HEADLESS", "1")

    def fn(a, b):
        return pd.DataFrame({"sum": [a + b]})

    table = explore(fn, {"a": [1, 2], "b": [10, 20]}, static=[{"a": 1, "b": 10}, {"a": 2, "b": 20}],
                    title="demo")
    assert list(table.columns) == ["a", "b", "sum"] and list(table["sum"]) == [11, 22]
    assert "static table" in capsys.readouterr().out


def test_a_run_is_never_its_own_reference_however_its_path_is_spelt(tmp_path, monkeypatch):
    """``sglab verify data/recorded/X.csv --against`` names the run relatively; the record is read
    with absolute paths: the run must still be left out of what it is compared with."""
    from types import SimpleNamespace

    monkeypatch.chdir(tmp_path)
    me = SimpleNamespace(path=Path("X.csv"))
    record = [SimpleNamespace(path=tmp_path / "X.csv"), SimpleNamespace(path=tmp_path / "Y.csv")]
    assert runs.others(me, record) == record[1:]


def test_a_runs_memo_computes_once_and_hands_out_copies(tmp_path):
    run = runs.Run(pd.DataFrame({"x": [1, 2]}), {}, tmp_path / "r.csv")
    made = []

    def make():
        made.append(1)
        return {"table": pd.DataFrame({"y": [3]}), "sizes": [1, 2]}

    a = run.memo("facts", make)
    a["sizes"].append(99)
    a["table"].loc[0, "y"] = -1
    b = run.memo("facts", make)
    assert made == [1] and b["sizes"] == [1, 2] and b["table"].y.tolist() == [3]
    assert run.memo("other", lambda: 7) == 7 and len(made) == 1


def test_missing_cells_read_blank():
    df = pd.DataFrame({"calls": [306.0, None], "ms": [1.5, None], "name": ["a", "b"]})
    shown = text.blank(df)
    assert list(shown["calls"]) == [306.0, ""] and list(shown["ms"]) == [1.5, ""]
    assert "NaN" not in shown.to_string() and df["calls"].isna().tolist() == [False, True]
    assert list(text.blank(df, ["ms"])["calls"].isna()) == [False, True]  # only `cols`


def test_an_exact_count_that_is_a_mean_keeps_its_half():
    """18.5 and 17.5 kernels per layer (a mean over layers) both round to 18 as whole numbers:
    an exact count keeps them apart, and whole counts still read without ``.0``."""
    assert text.count([17.5]) == text.count([18.5]) == "18"
    assert (text.count([17.5], exact=True), text.count([18.5, 24.5],
                                                       exact=True)) == ("17.5", "18.5–24.5")
    assert text.count([18.0, 24.0], exact=True) == "18–24" and text.count(148.0,
                                                                          exact=True) == "148"


def test_a_change_that_prints_as_zero_has_no_sign():
    """A drift of -0.4% reads ``0%`` (not ``-0%``) alone or as a span's end; others keep theirs."""
    assert text.signed(-0.004) == text.signed(0.004) == "0%" and text.signed(-0.05) == "-5%"
    assert text.span([-0.004, 0.1], "{:+.0%}") == "0%–+10%" and text.span([-1e-4]) == "0.00"


def test_software_versions_read_torchs_without_importing_it(tmp_path):
    """torch's version and CUDA come from its version.py where torch is not imported (2 s saved in
    notebook 00 and `sglab env`), and agree with torch's own answer."""
    import json
    import subprocess
    import sys

    code = ("import json, sys; from sglab.core import hardware as h; a = h.software(); "
            "lazy = 'torch' not in sys.modules; import torch; "
            "print(json.dumps([lazy, a, h.software(), torch.__version__]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-800:]
    lazy, before, after, version = json.loads(out.stdout)
    assert lazy and before == after and before["torch"] == version
    from sglab.core import hardware

    fake = tmp_path / "version.py"
    fake.write_text("from typing import Optional\n__version__ = '2.11.0+cu130'\n"
                    "cuda: Optional[str] = '13.0'\nhip: Optional[str] = None\n")
    assert hardware._read_version_file(fake) == ("2.11.0+cu130", "13.0")


def test_an_answer_is_folded_and_a_file_link_is_relative(capsys, monkeypatch):
    import pandas as pd

    from sglab.core import notebook as nb

    shown = []
    monkeypatch.setattr(nb, "in_notebook", lambda: True)
    monkeypatch.setattr(
        nb, "display", lambda data, text, markdown=None, html=None: shown.append(
            (text, markdown, html)))
    nb.reveal(pd.DataFrame({"kernels": [2]}))
    assert shown[-1][2].startswith("<details><summary>Show the answer</summary><table")
    nb.file_link(runs.repo_root() / "data" / "recorded" / "x.trace.json.gz", "Perfetto file")
    text, md, _ = shown[-1]
    assert text == "Perfetto file: data/recorded/x.trace.json.gz"
    assert md == "Perfetto file: [x.trace.json.gz](../data/recorded/x.trace.json.gz)"


def test_a_gpu_test_module_leaves_no_temporary_file_behind():
    """What a GPU test module's measurements write in the temporary folder goes with the module;
    other modules keep the usual temporary folder."""
    import os
    import tempfile

    from tests import scratch_for

    before = tempfile.gettempdir()
    with scratch_for("tests.swa_loc.test_gpu"):
        inside = Path(tempfile.mkdtemp(prefix="sglab-swa_loc-"))
        assert inside.parent != Path(before) and os.environ["TMPDIR"] == str(inside.parent)
    assert not inside.parent.exists() and tempfile.gettempdir() == before
    with scratch_for("tests.tools.test_cli"):
        assert tempfile.gettempdir() == before
