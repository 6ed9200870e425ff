"""The report: offline pages titled by their notebook with a way back, and an index that shows per
notebook its claim, headline, verdict, live time, status and first figure (built from executed
notebooks made here, without a kernel)."""

import base64
import io
import os
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from sglab.tools import fixes as catalog, nbtools
from sglab.tools import index_page as index, pages, report, timings


def _png(width_in=12.0) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width_in, 3), dpi=100)
    ax.plot([0, 1], [1, 0])
    buf = io.BytesIO()
    # savefig.dpi may be set by a figures module imported before
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def _executed(stem: str, title: str, wide: bool = True):
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_markdown_cell(f"# {title}\n\nIntro."))
    code = nbformat.v4.new_code_cell("plot()")
    code.outputs = [
        nbformat.v4.new_output(
            "display_data",
            data={"image/png": base64.b64encode(_png()).decode(), "text/plain": "<Figure>"})
    ]
    nb.cells.append(code)
    if wide:
        table = "<table>" + "<tr>" + "".join(
            f"<td>column {i}</td>" for i in range(60)) + "</tr></table>"
        out = nbformat.v4.new_code_cell("df")
        out.outputs = [
            nbformat.v4.new_output("execute_result", data={"text/html": table, "text/plain": "df"},
                                   execution_count=2)
        ]
        nb.cells.append(out)
    return nbtools.Result(Path(f"notebooks/{stem}.ipynb"), "ok", "recorded", 3.25, nb=nb)


def test_title_is_the_first_heading():
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("x = 1"),
        nbformat.v4.new_markdown_cell("# 04 · `swa_loc` *fix*\ntext")
    ]
    assert pages.notebook_title(nb, "fallback") == "04 · swa_loc fix"
    assert pages.notebook_title(nbformat.v4.new_notebook(), "fallback") == "fallback"


def test_page_offline_titled_linked_and_scrolling(tmp_path):
    r = _executed("04_swa_loc", "04 · A page title")
    path = pages.write_page(r.nb, tmp_path / "04_swa_loc.html", title="04 · A page title",
                            status="ok · recorded")
    text = path.read_text()
    assert "<title>04 · A page title</title>" in text
    assert 'href="index.html"' in text
    assert not re.search(r"<script[^>]+src=[\"']?https?:", text), "a CDN script is loaded"
    assert "cdnjs" not in text and "mathjax" not in text.lower()
    assert "overflow-x: auto" in text, "wide outputs must scroll"
    assert "column 59" in text


def _story():
    nb = nbformat.v4.new_notebook()
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    nb.cells = [
        md("# 09 · A story"),
        code("MODE = 'auto'", metadata={"tags": ["parameters"]}),
        code("MODE = 'recorded'", metadata={"tags": ["injected-parameters"]}),
        md("## The lesson: `rebuild` first\n\n```\n## not a heading\n```"),
        code("secret_input_line = 1"),
        md("Text.\n\n## Real SGLang"),
        md("## Appendix"),
        md("## GPU tables")
    ]
    nb.cells[4].outputs = [nbformat.v4.new_output("stream", text="an output stays\n")]
    return nb


def test_the_page_hides_code_behind_one_switch_and_lists_its_sections(tmp_path):
    """Inputs hidden by a class on the body that one button (inline script, no CDN) toggles; the
    parameters cells hidden whatever it says; the contents built at export time from the ``##``
    headings, with anchors the page has, and those from ``## Appendix`` on under one entry."""
    text = pages.write_page(_story(), tmp_path / "p.html", title="09 · A story").read_text()
    body = re.search(r"<body[^>]*>", text).group(0)
    assert "sglab-hide-code" in body
    assert re.search(r"<button[^>]*>show code</button>", text)
    assert "classList.toggle('sglab-hide-code')" in text
    assert re.search(r"body\.sglab-hide-code \.jp-CodeCell \.jp-Cell-inputWrapper", text)
    assert re.search(
        r"\.jp-CodeCell\.celltag_parameters, \.jp-CodeCell\.celltag_injected-parameters "
        r"\{ display: none; \}", text)
    assert "celltag_parameters" in text and "celltag_injected-parameters" in text
    assert "secret_input_line" in text and "an output stays" in text  # hidden, not removed
    toc = re.search(r"<div class=\"sglab-toc\">(.*?)</div>\s*</nav>", text, re.S).group(1)
    links = re.findall(r'<a href="#([^"]+)">([^<]+)</a>', toc)
    assert [t for _, t in links
            ] == ["The lesson: rebuild first", "Real SGLang", "Appendix", "GPU tables"]
    assert "<summary>Appendix</summary>" in toc
    assert toc.index("Real SGLang") < toc.index("<details>") < toc.index("GPU tables")
    for anchor, _ in links:
        assert f'id="{anchor}"' in text, anchor
    assert pages.contents(_story())["appendix"] == ("Appendix", "Appendix")
    assert not re.search(r"<script[^>]+src=", text)


def test_broken_page_still_says_why(tmp_path, monkeypatch):

    def boom(*a, **k):
        raise ValueError("cannot render")

    monkeypatch.setattr(pages, "exporter", boom)
    text = pages.write_page(nbformat.v4.new_notebook(), tmp_path / "x.html", title="X").read_text()
    assert "HTML export failed: ValueError: cannot render" in text and "index.html" in text


def test_first_figure_and_thumbnail():
    from PIL import Image

    r = _executed("04_swa_loc", "t")
    png = index.first_figure(r.nb)
    assert Image.open(io.BytesIO(png)).width == 1200
    assert Image.open(io.BytesIO(index.thumbnail(png))).width == 360
    assert index.first_figure(nbformat.v4.new_notebook()) is None


def test_index_cards(tmp_path):
    """A fix's index card is its review card (the bug, the releases, the real engine's answer)
    with the engine's and the rebuild's verdict lines; 00 has its sentence."""
    import html

    from sglab.core import card as K

    results = [_executed("04_swa_loc", "04 · SWA"), _executed("00_start_here", "start here")]
    results[1].nb.cells = results[1].nb.cells[:1]  # no figure
    path = index.write_index(results, tmp_path, [("GPUs", "0"), ("torch", "x")],
                             live_times={"04_swa_loc": "H100 ×1: 12.5 s"})
    text = path.read_text()
    p = catalog.card("swa_loc")
    assert p is not None, "swa_loc declares its card"
    assert index.code_spans(K.html_card(p)) in text
    assert "<code>swa_loc</code>" in text and "`swa_loc`" not in text  # markdown code, as code
    assert index.code_spans(html.escape(p["bug"])) in text and html.escape(p["releases"]) in text
    assert p["engine_verdicts"] and p["rebuild_verdicts"]
    for v in p["engine_verdicts"]:
        assert f"verdict: real engine: {html.escape(v)}" in text
    for v in p["rebuild_verdicts"]:
        assert f"verdict: rebuild: {html.escape(v)}" in text
    assert html.escape(catalog.START_CLAIM) in text
    assert "live time: H100 ×1: 12.5 s" in text
    assert f"live time: {timings.NOT_RECORDED}" in text  # 00 has no record
    assert text.count("data:image/png;base64,") == 1 and "no figure" in text
    assert re.search(r"<details><summary>Environment[^<]*</summary><table>.*torch", text)
    assert "3.2 s" in text or "3.3 s" in text


def test_every_fix_declares_its_review_card():
    """The index card, the README row and 00's table of every fix are its ``CARD``."""
    assert all(hasattr(catalog.claims(f.name), "CARD") for f in catalog.FIXES)


def test_the_readme_row_of_a_fix_says_what_its_card_says():
    from sglab.core import card as K
    from sglab.tools import readme

    for fix in ("swa_loc", "breakable_graph", "capture_sizes"):  # each declares its card
        p = catalog.card(fix)
        row = readme.row(catalog.by_stem(catalog.get(fix).stem)).replace("\\|", "|")
        assert " ".join(p["bug"].split()) in row and f"Releases: {p['releases']}." in row
        assert " ".join(K.summary(p).split()) in row


@pytest.mark.parametrize("status", ["failed", "interrupted"])
def test_index_shows_errors(tmp_path, status):
    r = _executed("01_pcg_gate", "01", wide=False)
    r.status, r.error = status, f"{status}: cell 3 (x = 1) after 2.0 s"
    text = index.write_index([r], tmp_path, [], live_times={}).read_text()
    assert f"class='{status}'" in text and f"{status}: cell 3" in text


@pytest.mark.parametrize(
    "argv", [["record", "swa_loc", "--param", "oops"], ["run", "04_swa_loc", "--param", "=3"]])
def test_a_param_without_a_name_is_one_line_and_exit_2(argv, capsys):
    from sglab.tools import cli

    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sglab {argv[0]}: --param needs NAME=VALUE") and len(
        err.splitlines()) == 1


def test_a_param_no_notebook_defines_is_refused_before_anything_runs(capsys):
    """`sglab run --param` sets only what a notebook's parameters cell assigns: an unknown name
    (a typo of MODE) would be injected and ignored, so it is one line, exit 2, nothing run."""
    from sglab.tools import cli, nbtools

    nb = nbtools.notebooks_dir() / "04_swa_loc.ipynb"
    assert nbtools.parameter_names(nb)[:2] == ["MODE", "PARAMS"]
    assert cli.main(["run", "04_swa_loc", "--param", "MDOE='live'"]) == 2
    out = capsys.readouterr()
    assert out.err == ("sglab run: --param MDOE: not a parameter of 04_swa_loc (its parameters: "
                       f"{', '.join(nbtools.parameter_names(nb))})\n") and not out.out


@pytest.mark.parametrize("argv, said", [
    (["--param", "MODE=lve"], "sglab run: --param MODE=lve: one of auto, live, recorded"),
    (["--jobs", "0"], "sglab run: --jobs must be at least 1, got 0"),
])
def test_a_bad_mode_or_job_count_is_refused_before_anything_runs(argv, said, capsys, monkeypatch):
    from sglab.tools import cli, report

    monkeypatch.setattr(report, "run_notebooks", lambda *a, **k: pytest.fail("ran"))
    assert cli.main(["run", "04_swa_loc", *argv]) == 2
    out = capsys.readouterr()
    assert out.err == said + "\n" and not out.out


def test_an_out_folder_or_notebook_that_cannot_serve_is_refused_before_anything_runs(
        tmp_path, capsys, monkeypatch):
    """A notebook that does not read, an ``--out`` that is a file or cannot be made, and an
    ``--out`` that holds the notebook itself (its executed copy would replace it): one line each,
    exit 2, nothing run and nothing changed."""
    from sglab.tools import cli, nbtools, report

    monkeypatch.setattr(report, "run_notebooks", lambda *a, **k: pytest.fail("ran"))
    mine, bad, afile = tmp_path / "mine.ipynb", tmp_path / "bad.ipynb", tmp_path / "afile"
    shutil.copy(nbtools.notebooks_dir() / "00_start_here.ipynb", mine)
    bad.write_text('{"cells": [')
    afile.write_text("x")
    kept = mine.read_bytes()
    for argv, said in (
        ([str(bad)], f"{bad}: not a notebook that reads (Notebook does not appear to be JSON"),
        (["00", "--out", str(afile)], f"--out {afile}: a file, not a folder (name a folder)"),
        (["00", "--out", str(afile / "x")], f"--out {afile / 'x'}: not a directory"),
        ([str(mine), "--out", str(tmp_path)], f"--out {tmp_path}: the executed copy of mine.ipynb "
         "would replace the notebook itself (name another folder)"),
        (["00", "--out", str(nbtools.notebooks_dir())], "the executed copy of 00_start_here.ipynb"),
    ):
        assert cli.main(["run", *argv]) == 2, argv
        out = capsys.readouterr()
        assert out.err.startswith("sglab run: ") and said in out.err, out.err
        assert len(out.err.splitlines()) == 1 and not out.out
    assert mine.read_bytes() == kept


def test_the_index_takes_recorded_facts_read_while_the_notebooks_ran(tmp_path):
    """`run_notebooks` reads each recorded notebook's claim facts while its workers run; the index
    shows those and reads nothing again (a live notebook's facts still come from its live runs)."""
    r = _executed("04_swa_loc", "04", wide=False)
    given = {
        "card": "", "claim": "c", "headline": "read while the notebooks ran", "verdicts": ["v"],
        "source": "recorded runs"
    }
    text = index.write_index([r], tmp_path, [], live_times={},
                             recorded={"04_swa_loc": given}).read_text()
    assert "read while the notebooks ran" in text and "verdict: v" in text
    assert index.recorded_facts("04_swa_loc")["card"] in index.write_index(
        [r], tmp_path, [], live_times={}).read_text()


def test_sglab_run_and_its_workers_start_without_the_fixes_or_torch():
    """`sglab run`'s workers import :mod:`sglab.tools.pages` only, and the command itself (the
    report module, the choice of how many notebooks run at a time where no GPU device exists)
    neither: the kernels import what a notebook needs, and the run reads the fixes while the
    notebooks run (about 2 s of torch a process on the CPU box). The fixes' records import pandas,
    a rebuild torch: the check can see both."""
    import subprocess
    import sys

    def loaded(code: str) -> str:
        out = subprocess.run([
            sys.executable, "-c", f"import sys; {code}; print(','.join(m for m in ('torch', "
            "'pandas', 'sglab.tools.fixes') if m in sys.modules))"
        ], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-500:]
        return out.stdout.strip()

    assert loaded("import sglab.tools.pages") == ""
    jobs = "; r.default_jobs()" if report.hardware.no_gpu_device() else ""
    assert loaded(f"import sglab.tools.report as r, sglab.tools.pages as p{jobs}") == ""
    assert loaded("import sglab.tools.fixes") == "pandas,sglab.tools.fixes"
    assert loaded("import sglab.pcg_gate.rebuild") == "torch"


def test_no_gpu_device_reads_the_device_files(tmp_path):
    assert report.hardware.no_gpu_device(str(tmp_path))
    (tmp_path / "nvidiactl").touch()  # the driver's control file alone is no GPU
    assert report.hardware.no_gpu_device(str(tmp_path))
    (tmp_path / "nvidia0").touch()
    assert not report.hardware.no_gpu_device(str(tmp_path))


@pytest.mark.parametrize("signum, status", [(0, 0), (2, 130), (15, 143)])
def test_sglab_run_exits_as_a_shell_reports_the_signal_that_stopped_it(
        signum, status, tmp_path, monkeypatch, capsys):
    """Ctrl-C 130, SIGTERM 143 (128 + the signal the notebooks were stopped by); 0 when none was."""
    from sglab.tools import cli, report

    def ran(paths, out, **_):
        return [
            nbtools.Result(p, "interrupted" if signum else "ok", "recorded", 1.0,
                           stopped_by_signal=signum) for p in paths
        ]

    monkeypatch.setattr(report, "run_notebooks", ran)
    assert cli.main(["run", "04_swa_loc", "--out", str(tmp_path)]) == status


def test_running_some_notebooks_again_keeps_the_others_in_the_index(tmp_path):
    """`sglab run 04_swa_loc` into a folder an earlier run filled: 04's entry is replaced, the
    others stay (read back from index.json, their cards marked with the time they ran) while their
    page is still in the folder; one whose page is gone leaves the index."""
    import json

    first = [_executed(s, s, wide=False) for s in ("03_breakable_graph", "04_swa_loc", "05_x")]
    for r in first:
        r.started = 1_700_000_000.0  # 2023-11-14 22:13 UTC
        nbformat.write(r.nb, tmp_path / r.path.name)
        (tmp_path / f"{r.path.stem}.html").write_text("page")
    index.write_index(first, tmp_path, [], live_times={})
    (tmp_path / "05_x.html").unlink()  # its page went: so does its entry

    again = _executed("04_swa_loc", "04 again", wide=False)
    again.status, again.error = "failed", "failed: cell 2 (boom)"
    text = index.write_index([again], tmp_path, [], live_times={}).read_text()
    entries = json.loads((tmp_path / "index.json").read_text())
    assert [(e["notebook"], e["status"]) for e in entries] == [("03_breakable_graph.ipynb", "ok"),
                                                               ("04_swa_loc.ipynb", "failed")]
    assert entries[0]["ran_utc"] == "2023-11-14 22:13 UTC"
    assert entries[0]["run_utc"] < entries[1]["run_utc"]  # the run that ran each: kept, and this
    assert "0/1 notebooks ran cleanly. 1 more from earlier runs into this folder." in text
    assert text.count("class='card'") == 2 and "05_x" not in text
    assert "from an earlier run at 2023-11-14 22:13 UTC: <span class='ok'>ok</span>" in text
    assert "this run: <span class='failed'>failed</span>" in text
    assert text.index("03_breakable_graph.html") < text.index("04_swa_loc.html")  # reading order
    assert text.count("data:image/png;base64,") == 2  # the earlier card's figure, from its copy

    # an index written before entries carried their time: the page's time stands in
    (tmp_path / "index.json").write_text(
        json.dumps([{k: v
                     for k, v in e.items() if k != "ran_utc"} for e in entries]))
    os.utime(tmp_path / "03_breakable_graph.html", (1_600_000_000, 1_600_000_000))
    text = index.write_index([_executed("00_start_here", "00", wide=False)], tmp_path, [],
                             live_times={}).read_text()
    assert "from an earlier run at 2020-09-13 12:26 UTC" in text and text.count("class='card'") == 3
