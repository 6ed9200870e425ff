"""The report's links work wherever ``--out`` puts it: a data file a page links (a Perfetto trace)
is copied into the report's ``files/`` and linked there; a link to another notebook of the run goes
to its page, not its ``.ipynb``; and with the code hidden, no ``Out[n]:`` prompt shows."""

import re
import types
from pathlib import Path
from urllib.parse import unquote, urlsplit

import nbformat
import pytest

from sglab.core import notebook, runs
from sglab.tools import pages


HREF = re.compile(r"""\bhref=(["'])([^"']*)\1""")


def _relative_hrefs(text: str) -> list[str]:
    """The page's links to a file relative to it (no scheme, host, root or anchor alone)."""
    found = []
    for _, href in HREF.findall(text):
        parts = urlsplit(href)
        if parts.path and not (parts.scheme or parts.netloc or parts.path.startswith("/")):
            found.append(unquote(parts.path))
    return found


def _shown_markdown(monkeypatch, call) -> str:
    """The markdown that ``call()`` shows in a notebook (through :func:`notebook.display`)."""
    shown = []
    monkeypatch.setattr(notebook, "in_notebook", lambda: True)
    monkeypatch.setattr(notebook, "display",
                        lambda data, text, markdown=None, html=None: shown.append(markdown))
    call()
    return shown[-1]


@pytest.fixture
def checkout(tmp_path, monkeypatch) -> Path:
    """A checkout of its own: a recorded trace under data/, a notebook folder, a file outside
    data/."""
    root = tmp_path / "checkout"
    trace = root / "data" / "recorded" / "swa_loc" / "20261129T041939Z_nvidia-h200-x1.trace.json.gz"
    trace.parent.mkdir(parents=True)
    trace.write_bytes(b"\x1f\x8b trace bytes")
    (root / "data" / "recorded" / "other.json").write_text("{}")  # in data/, linked by no page
    (root / "notebooks").mkdir()
    (root / "README.md").write_text("readme")
    monkeypatch.setattr(runs, "repo_root", lambda: root)
    return root


def _page_linking(markdown: str, *more: str):
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_markdown_cell("# 04 · links\n\n" + "\n\n".join(more)))
    cell = nbformat.v4.new_code_cell("show()")
    cell.outputs = [
        nbformat.v4.new_output("display_data",
                               data={"text/markdown": markdown, "text/plain": "link"})
    ]
    nb.cells.append(cell)
    return nb


def test_a_linked_data_file_is_copied_into_the_report_and_linked_there(
        checkout, tmp_path, monkeypatch):
    """The trace link ``file_link`` shows (relative to the notebooks, right in JupyterLab) is, on
    the page, a link to a copy in the report's ``files/``: it resolves from the page's folder, which
    is not the checkout's ``reports/``; a second page linking the same file shares the copy; links
    elsewhere (outside data/, the web, an anchor) stay as they were."""
    trace = next((checkout / "data").rglob("*.trace.json.gz"))
    md = _shown_markdown(monkeypatch, lambda: notebook.file_link(trace, "Perfetto file"))
    assert "](../data/recorded/swa_loc/" in md  # JupyterLab: from notebooks/
    out = tmp_path / "somewhere" / "else"
    out.mkdir(parents=True)
    nb = _page_linking(md, "[readme](../README.md) · [web](https://ui.perfetto.dev) · [top](#top)")
    for name in ("04_swa_loc.html", "05_grid_thw.html"):
        pages.write_page(nb, out / name, title="04 · links", linked_from=checkout / "notebooks")
    text = (out / "04_swa_loc.html").read_text()
    hrefs = _relative_hrefs(text)
    assert f"files/recorded/swa_loc/{trace.name}" in hrefs, hrefs
    assert (out / "files" / "recorded" / "swa_loc" / trace.name).read_bytes() == trace.read_bytes()
    assert "../README.md" in hrefs and 'href="https://ui.perfetto.dev"' in text
    assert 'href="#top"' in text
    copied = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert copied == ["04_swa_loc.html", "05_grid_thw.html", f"files/recorded/swa_loc/{trace.name}"]


def test_the_executed_copy_links_the_reports_copies_as_its_page_does(checkout, tmp_path,
                                                                     monkeypatch):
    """The report's ``.ipynb``, opened wherever the report went, links the same ``files/`` copies
    as its page: in markdown cells and in shown outputs, markdown or HTML; links elsewhere stay."""
    trace = next((checkout / "data").rglob("*.trace.json.gz"))
    rel, copy = (f"{d}recorded/swa_loc/{trace.name}" for d in ("../data/", "files/"))
    nb = _page_linking(f"Perfetto file: [trace]({rel})", f"[the trace]({rel}) [me](../README.md)")
    html_out = {"text/html": f'<a href="{rel}">t</a>', "text/plain": "t"}
    nb.cells[1].outputs.append(nbformat.v4.new_output("display_data", data=html_out))
    ran = types.SimpleNamespace(nb=nb, status="ok", mode="recorded", seconds=1.0)
    monkeypatch.setattr(pages.nbtools, "execute", lambda *a, **k: ran)
    out = tmp_path / "report"
    out.mkdir()
    pages.run_one(checkout / "notebooks" / "04_swa_loc.ipynb", out, None, 60, html_pages=False)
    cells = nbformat.read(out / "04_swa_loc.ipynb", 4).cells
    assert f"[the trace]({copy}) [me](../README.md)" in cells[0].source
    assert cells[1].outputs[0]["data"]["text/markdown"] == f"Perfetto file: [trace]({copy})"
    assert f'href="{copy}"' in cells[1].outputs[1]["data"]["text/html"]
    assert (out / copy).read_bytes() == trace.read_bytes()


def test_links_to_notebooks_the_report_wrote_go_to_their_pages(tmp_path):
    """``NN_topic.ipynb`` (as JupyterLab opens it) becomes ``NN_topic.html`` where the report holds
    both; a notebook it did not write, a path elsewhere, the web and a page's link to its own
    executed copy stay as they were."""
    for stem in ("00_start_here", "01_pcg_gate", "07_how_we_measure"):
        (tmp_path / f"{stem}.ipynb").write_text("{}")
        (tmp_path / f"{stem}.html").write_text("page")
    (tmp_path / "index.html").write_text("index")  # the index: no notebook of that name
    links = {
        "01_pcg_gate.ipynb": "01_pcg_gate.html",
        "07_how_we_measure.ipynb#how": "07_how_we_measure.html#how",
        "02_workspace_floor.ipynb": "02_workspace_floor.ipynb",
        "index.ipynb": "index.ipynb",
        "../notebooks/01_pcg_gate.ipynb": "../notebooks/01_pcg_gate.ipynb",
        "https://github.com/x/01_pcg_gate.ipynb": "https://github.com/x/01_pcg_gate.ipynb",
        "00_start_here.ipynb": "00_start_here.ipynb",  # the page's own executed copy
    }
    page = tmp_path / "00_start_here.html"
    page.write_text(" ".join(
        f'<a href="{a}">x</a>' for a in links) + " <a href='01_pcg_gate.ipynb'>")
    pages.link_pages(tmp_path, [page, tmp_path / "gone.html"])
    assert [h for _, h in HREF.findall(page.read_text())] == [*links.values(), "01_pcg_gate.html"]


def test_a_page_stopped_while_its_links_are_rewritten_keeps_its_old_text(tmp_path, monkeypatch):
    """The rewrite lands whole or not at all: a write cut short (a full disk, a signal) leaves the
    page as it was, and no partial copy beside it."""
    for stem in ("00_start_here", "01_pcg_gate"):
        (tmp_path / f"{stem}.ipynb").write_text("{}")
    (tmp_path / "01_pcg_gate.html").write_text("page")
    page = tmp_path / "00_start_here.html"
    old = '<a href="01_pcg_gate.ipynb">x</a>' * 50
    page.write_text(old)
    real = Path.write_text

    def cut_short(self, text, *args, **kwargs):
        real(self, text[:len(text) // 2], *args, **kwargs)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", cut_short)
    with pytest.raises(OSError):
        pages.link_pages(tmp_path, [page])
    monkeypatch.undo()
    assert page.read_text() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "00_start_here.html", "00_start_here.ipynb", "01_pcg_gate.html", "01_pcg_gate.ipynb"
    ]


def test_with_the_code_hidden_no_output_prompt_shows(tmp_path):
    """The ``Out[n]:`` prompt of a result is on the page (the switch shows it with the code), but
    the hidden-code state hides it, keeping its place so that outputs stay in line with the text."""
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("df", execution_count=3)
    cell.outputs = [
        nbformat.v4.new_output("execute_result", data={"text/plain": "a table"}, execution_count=3)
    ]
    nb.cells = [nbformat.v4.new_markdown_cell("# 09 · prompts"), cell]
    text = pages.write_page(nb, tmp_path / "p.html", title="09 · prompts").read_text()
    assert "sglab-hide-code" in re.search(r"<body[^>]*>", text).group(0)
    prompts = re.findall(r'<div class="([^"]*)">\s*Out\[3\]:', text)
    assert prompts and all("jp-OutputPrompt" in c.split() for c in prompts), prompts
    assert re.search(r"body\.sglab-hide-code \.jp-OutputPrompt \{ visibility: hidden; \}", text)


@pytest.mark.long(120)
def test_every_link_of_the_recorded_report_resolves_in_its_folder(recorded_report):
    """The session's report of every notebook (:mod:`tests.recorded_report`), written outside the
    checkout: every page's links to files resolve from the page's folder, none goes to the
    ``.ipynb`` of a notebook that has a page, and ``files/`` holds the files linked, no others."""
    folder, said = recorded_report
    written = sorted(folder.glob("[0-9][0-9]_*.html"))
    assert written, f"the run wrote no page\n{said}"
    assert not folder.resolve().is_relative_to(runs.repo_root().resolve())
    broken, to_notebook, linked = [], [], set()
    for page in written:
        for href in _relative_hrefs(page.read_text(encoding="utf-8")):
            target = (folder / href).resolve()
            if not target.is_file():
                broken.append(f"{page.name}: {href}")
            if href.endswith(".ipynb") and (folder / href).with_suffix(".html").is_file():
                to_notebook.append(f"{page.name}: {href}")
            if href.startswith(f"{pages.FILES}/"):
                linked.add(target)
    assert not broken, broken
    assert not to_notebook, to_notebook
    assert linked, "no page links a data file (a Perfetto trace)"
    assert {p.resolve() for p in (folder / pages.FILES).rglob("*") if p.is_file()} == linked


def test_the_shared_report_is_this_sessions_own_with_workers_or_without(monkeypatch, tmp_path):
    """Without xdist workers the session's folder is its own, not the parent every session shares,
    so a later session never reads an earlier session's report."""
    from types import SimpleNamespace

    from tests.recorded_report import session_folder

    factory = SimpleNamespace(getbasetemp=lambda: tmp_path / "pytest-7" / "popen-gw0")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    assert session_folder(factory) == tmp_path / "pytest-7"
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    factory = SimpleNamespace(getbasetemp=lambda: tmp_path / "pytest-8")
    assert session_folder(factory) == tmp_path / "pytest-8"
