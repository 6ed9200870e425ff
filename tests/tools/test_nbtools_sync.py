"""`sglab sync` pairs each notebook's two halves as jupytext does: the half edited since they were
last paired (as committed, or as the last sync left them) is written into the other, so an edit
saved from VS Code or Colab into the .ipynb lands in the .py; where both were edited it refuses in
one line and writes nothing."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import jupytext
import nbformat
import pytest

from sglab.tools import cli, nbtools


ROOT = Path(__file__).resolve().parents[2]
STEMS = ("00_start_here", "04_swa_loc")
EDIT = "# an edit saved from another editor"


def _git(folder: Path, *args: str) -> None:
    subprocess.run(["git", "-C",
                    str(folder), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True)


@pytest.fixture
def books(tmp_path, monkeypatch) -> Path:
    """Two committed notebook pairs in a git checkout of their own, which `sglab sync` works on."""
    folder = tmp_path / "notebooks"
    folder.mkdir()
    for stem in STEMS:
        for ext in (".py", ".ipynb"):
            shutil.copy(ROOT / "notebooks" / f"{stem}{ext}", folder / f"{stem}{ext}")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "pairs")
    monkeypatch.setattr(nbtools, "notebooks_dir", lambda: folder)
    return folder


def _edit_ipynb(path: Path, text: str = EDIT) -> None:
    """What saving from VS Code or Colab does: a cell edited, outputs and an execution count kept,
    editor metadata added, the kernel's display name changed."""
    nb = json.loads(path.read_text())
    code = next(c for c in nb["cells"] if c["cell_type"] == "code")
    code["source"] = [text + "\n", *code["source"]]
    code["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["out\n"]}]
    code["execution_count"] = 3
    code["metadata"]["colab"] = {"base_uri": "https://localhost:8080/"}
    nb["metadata"]["kernelspec"]["display_name"] = "Python 3 (ipykernel)"
    path.write_text(json.dumps(nb, indent=1))


def _edit_py(path: Path, text: str = "# an edit to the source") -> None:
    path.write_text(path.read_text().replace("# %% [markdown]\n",
                                             f"# %%\n{text}\n\n# %% [markdown]\n", 1))


def _files(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_an_ipynb_edit_lands_in_the_py(books, capsys):
    py, ipynb = books / "04_swa_loc.py", books / "04_swa_loc.ipynb"
    committed = py.read_text()
    _edit_ipynb(ipynb)
    other = _files(books)["00_start_here.py"], _files(books)["00_start_here.ipynb"]
    assert cli.main(["sync"]) == 0
    assert capsys.readouterr().out == "04_swa_loc.ipynb → 04_swa_loc.py\n"  # the pair it wrote
    text = py.read_text()
    # the edited cell, and nothing of the session: no output, editor metadata or kernel name
    cell = '# %% tags=["parameters"]\n'
    assert text == committed.replace(cell, f"{cell}{EDIT}\n", 1) and EDIT not in committed
    assert nbtools.py_source(jupytext.read(py)) == text  # as the workbook commits it
    assert nbtools.check_pair(ipynb) == []  # and the .ipynb clean again, in step with it
    assert (py.with_name("00_start_here.py").read_bytes(),
            ipynb.with_name("00_start_here.ipynb").read_bytes()) == other
    assert cli.main(["sync"]) == 0 and py.read_text() == text  # nothing more to do


def test_a_py_edit_still_lands_in_the_ipynb(books):
    py, ipynb = books / "04_swa_loc.py", books / "04_swa_loc.ipynb"
    _edit_py(py)
    before = py.read_text()
    assert cli.main(["sync"]) == 0
    assert py.read_text() == before and "# an edit to the source" in ipynb.read_text()
    assert nbtools.check_pair(ipynb) == []


def test_both_halves_edited_is_refused_and_nothing_is_written(books, capsys):
    py, ipynb = books / "04_swa_loc.py", books / "04_swa_loc.ipynb"
    _edit_py(py)
    _edit_ipynb(ipynb)
    _edit_ipynb(books / "00_start_here.ipynb")  # a pair that could be synced is not written either
    before = _files(books)
    assert cli.main(["sync"]) == 1
    out = capsys.readouterr()
    assert not out.out and out.err == (
        "sglab sync: 04_swa_loc: 04_swa_loc.py and 04_swa_loc.ipynb differ and both were edited "
        "since they were last paired: keep one with `sglab sync --from py` or `sglab sync --from "
        "ipynb` (the other's edits are lost)\n")
    assert _files(books) == before
    assert cli.main(["sync", "--from", "ipynb"]) == 0
    assert EDIT in py.read_text() and "# an edit to the source" not in py.read_text()
    assert nbtools.check_pair(ipynb) == []


def test_from_py_keeps_the_source(books):
    py, ipynb = books / "04_swa_loc.py", books / "04_swa_loc.ipynb"
    _edit_py(py)
    _edit_ipynb(ipynb)
    assert cli.main(["sync", "--from", "py"]) == 0
    assert EDIT not in ipynb.read_text() and "# an edit to the source" in ipynb.read_text()


def test_the_last_sync_is_a_pairing_too(books):
    """A .py edit synced, then the .ipynb edited before anything is committed: the .ipynb changed
    since the last pairing (the sync's), the .py did not, so the .ipynb is taken."""
    py, ipynb = books / "04_swa_loc.py", books / "04_swa_loc.ipynb"
    _edit_py(py)
    assert cli.main(["sync"]) == 0
    _edit_ipynb(ipynb)
    assert cli.main(["sync"]) == 0
    assert EDIT in py.read_text() and "# an edit to the source" in py.read_text()


def test_outside_git_the_newer_half_wins(tmp_path, monkeypatch):
    monkeypatch.setattr(nbtools, "notebooks_dir", lambda: tmp_path)
    py, ipynb = tmp_path / "04_swa_loc.py", tmp_path / "04_swa_loc.ipynb"
    shutil.copy(ROOT / "notebooks" / py.name, py)
    shutil.copy(ROOT / "notebooks" / ipynb.name, ipynb)
    _edit_ipynb(ipynb)
    os.utime(py, (1_600_000_000, 1_600_000_000))
    assert nbtools.pair_side(py) == "ipynb"
    _edit_py(py)
    os.utime(ipynb, (1_600_000_000, 1_600_000_000))
    assert nbtools.pair_side(py) == "py"
    assert cli.main(["sync"]) == 0 and EDIT not in ipynb.read_text()


def test_a_notebook_made_in_another_editor_gets_its_py(books):
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# 07 · new"),
        nbformat.v4.new_code_cell("MODE = 'auto'", metadata={"tags": ["parameters"]})
    ])
    nb.metadata["kernelspec"] = {
        "display_name": "Python 3", "language": "python", "name": "python3"
    }
    nbformat.write(nb, books / "07_new.ipynb")
    assert cli.main(["sync"]) == 0
    assert nbtools.check_pair(books / "07_new.ipynb") == []
    assert '# %% tags=["parameters"]\nMODE = \'auto\'' in (books / "07_new.py").read_text()


def test_check_passes_on_the_committed_pairs(capsys):
    assert cli.main(["sync", "--check"]) == 0 and capsys.readouterr().out == ""


def test_pairs_in_step_are_left_alone_and_said_so_in_one_line(books, capsys):
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in books.iterdir()}
    for argv in (["sync"], ["sync", "--from", "py"], ["sync", "--from", "ipynb"]):
        assert cli.main(argv) == 0
        assert capsys.readouterr().out == "all 2 pairs already in sync\n", argv
        assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in books.iterdir()} == before


def test_a_round_trip_through_the_ipynb_keeps_every_blank_line(books):
    """01's .py has two blank lines after a markdown cell, before a def (its .ipynb's
    lines_to_next_cell): written from the .ipynb, the .py keeps them where they were."""
    for ext in (".py", ".ipynb"):
        shutil.copy(ROOT / "notebooks" / f"01_pcg_gate{ext}", books / f"01_pcg_gate{ext}")
    assert '"lines_to_next_cell": 2' in (books / "01_pcg_gate.ipynb").read_text()
    before = _files(books)
    assert cli.main(["sync", "--from", "ipynb"]) == 0 and _files(books) == before
    assert cli.main(["sync", "--from", "py"]) == 0 and _files(books) == before


def test_an_ipynb_that_does_not_read_is_named_in_one_line(books, capsys):
    ipynb = books / "04_swa_loc.ipynb"
    ipynb.write_text(ipynb.read_text()[:500])  # cut short, as an interrupted save leaves it
    before = _files(books)
    says = (f"{ipynb}: not a readable notebook (Notebook does not appear to be JSON); restore it, "
            "or rewrite it from 04_swa_loc.py with `sglab sync --from py`\n")
    assert cli.main(["sync", "--check"]) == 1
    assert capsys.readouterr() == (says, "")
    for argv in (["sync"], ["sync", "--from", "ipynb"]):
        assert cli.main(argv) == 1
        assert capsys.readouterr() == ("", f"sglab sync: {says}"), argv
        assert _files(books) == before  # nothing written, the other pair's neither
    assert cli.main(["sync", "--from", "py"]) == 0
    assert nbtools.check_pair(ipynb) == []
