"""The lab's contents manager: each notebook listed once, and saving after a session (outputs, a new
kernelspec, timing stamps) writes files identical to the committed ones, while an edited cell lands
in both files."""

import asyncio
import shutil
from pathlib import Path

import jupytext
import nbformat
import pytest

from sglab.tools import nbtools


pytest.importorskip("jupyter_server")
from sglab.tools.lab import ContentsManager  # noqa: E402


ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))


@pytest.mark.parametrize("py", SOURCES, ids=lambda p: p.stem)
def test_py_source_round_trips(py):
    text = py.read_text()
    assert nbtools.py_source(jupytext.read(py)) == text
    assert nbtools.py_source(nbformat.read(py.with_suffix(".ipynb"), as_version=4)) == text


@pytest.fixture
def lab_dir(tmp_path):
    for stem in ("00_start_here", "04_swa_loc"):
        for ext in (".py", ".ipynb"):
            shutil.copy(ROOT / "notebooks" / f"{stem}{ext}", tmp_path / f"{stem}{ext}")
    shutil.copy(ROOT / "jupytext.toml", tmp_path / "jupytext.toml")
    (tmp_path / "helper.py").write_text("x = 1\n")
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")]),
                   tmp_path / "scratch.ipynb")
    return tmp_path


def _session(content: dict) -> dict:
    """What opening and running a notebook in JupyterLab does to its model."""
    content["metadata"]["kernelspec"]["display_name"] = "Python 3 (ipykernel)"
    content["metadata"]["language_info"] = {"name": "python", "version": "3.11"}
    for i, cell in enumerate(content["cells"]):
        if cell["cell_type"] == "code":
            cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "out\n"}]
            cell["execution_count"] = i
            cell["metadata"]["execution"] = {"iopub.status.busy": "2026-01-01T00:00:00Z"}
    return content


def test_listing_shows_each_notebook_once(lab_dir):
    model = asyncio.run(ContentsManager(root_dir=str(lab_dir)).get(""))
    names = sorted(item["name"] for item in model["content"])
    assert names == [
        "00_start_here.ipynb", "04_swa_loc.ipynb", "helper.py", "jupytext.toml", "scratch.ipynb"
    ]


@pytest.mark.parametrize("name", ["00_start_here.ipynb", "04_swa_loc.ipynb"])
def test_session_save_leaves_files_as_committed(lab_dir, name):
    before = {p.name: p.read_bytes() for p in lab_dir.glob(Path(name).stem + ".*")}

    async def run():
        cm = ContentsManager(root_dir=str(lab_dir))
        model = await cm.get(name)
        saved = await cm.save({"type": "notebook", "content": _session(model["content"])}, name)
        assert saved["last_modified"] == (await cm.get(name, content=False))["last_modified"]

    asyncio.run(run())
    after = {p.name: p.read_bytes() for p in lab_dir.glob(Path(name).stem + ".*")}
    assert after == before


def test_edit_lands_in_both_files_without_outputs(lab_dir):

    async def run():
        cm = ContentsManager(root_dir=str(lab_dir))
        content = _session((await cm.get("04_swa_loc.ipynb"))["content"])
        code = next(c for c in content["cells"]
                    if c["cell_type"] == "code" and "MODE" in "".join(c["source"]))
        code["source"] = "MODE = 'recorded'  # edited in the lab"
        await cm.save({"type": "notebook", "content": content}, "04_swa_loc.ipynb")

    asyncio.run(run())
    assert "MODE = 'recorded'  # edited in the lab" in (lab_dir / "04_swa_loc.py").read_text()
    assert nbtools.check_pair(lab_dir / "04_swa_loc.ipynb") == []
    assert "text_representation" not in (lab_dir / "04_swa_loc.py").read_text()


def test_other_notebooks_keep_their_outputs(lab_dir):

    async def run():
        cm = ContentsManager(root_dir=str(lab_dir))
        content = (await cm.get("scratch.ipynb"))["content"]
        content["cells"][0]["outputs"] = [{
            "output_type": "stream", "name": "stdout", "text": "2\n"
        }]
        await cm.save({"type": "notebook", "content": content}, "scratch.ipynb")

    asyncio.run(run())
    assert nbformat.read(lab_dir / "scratch.ipynb",
                         as_version=4).cells[0].outputs[0]["text"] == "2\n"
