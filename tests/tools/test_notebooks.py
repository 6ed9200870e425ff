"""Every notebook: committed clean, in sync with its .py, listed in the catalog and the README, and
executing from top to bottom on this machine (cells tagged needs-gpu skipped without CUDA) with all
outputs shown on failure."""

import os
import re
from pathlib import Path

import pytest

from sglab.tools import fixes as catalog, nbtools
from tests.recorded_report import report_entry
from tests.tools import outputs_text


pytestmark = pytest.mark.long(45)

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
CELL_TIMEOUT = int(os.environ.get("SGLAB_CELL_TIMEOUT", "900"))


def test_there_are_notebooks():
    assert (ROOT / "notebooks" / "00_start_here.ipynb") in NOTEBOOKS


@pytest.mark.parametrize("ipynb", NOTEBOOKS, ids=lambda p: p.stem)
def test_clean_and_paired(ipynb):
    assert nbtools.check_pair(ipynb) == []


@pytest.mark.parametrize("ipynb", NOTEBOOKS, ids=lambda p: p.stem)
def test_listed_in_catalog_and_readme(ipynb):
    entry = catalog.by_stem(ipynb.stem)
    assert entry is not None, f"{ipynb.stem} is missing from sglab.tools.fixes.NOTEBOOKS"
    assert ipynb.stem in (ROOT / "README.md").read_text(), \
        f"{ipynb.stem} is missing from the README index"


def test_catalog_entries_have_notebooks():
    for e in catalog.NOTEBOOKS:
        assert (ROOT / "notebooks" / f"{e.stem}.py").exists(), e.stem


def test_parameters_cell_first_code_cell():
    import nbformat

    for ipynb in NOTEBOOKS:
        nb = nbformat.read(ipynb, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert "parameters" in code[0].metadata.get("tags", []), \
            f"{ipynb.stem}: first code cell is not `parameters`"
        assert "MODE" in code[0].source


@pytest.mark.notebooks
@pytest.mark.parametrize("ipynb", NOTEBOOKS, ids=lambda p: p.stem)
def test_executes(ipynb, monkeypatch, request):
    """Where a GPU is, the notebook runs here as ``auto`` runs it (live); elsewhere the session's
    one recorded-mode ``sglab run`` (:mod:`tests.recorded_report`) has executed it."""
    from sglab.core import hardware
    from sglab.core.notebook import read_mode

    if hardware.has_cuda():
        monkeypatch.setenv("MPLBACKEND", "Agg")
        monkeypatch.setenv("SGLAB_REAL", "auto")  # the real sections as a reader sees them
        result = nbtools.execute(ipynb, cell_timeout=CELL_TIMEOUT)
        status, error, nb, mode = result.status, result.error, result.nb, result.mode
    else:
        import nbformat

        folder, said = request.getfixturevalue("recorded_report")
        entry, done = report_entry(folder, ipynb.stem), folder / ipynb.name
        if not done.exists():
            pytest.fail(f"{ipynb.name}: the report run wrote no executed notebook\n{said}",
                        pytrace=False)
        nb = nbformat.read(done, as_version=4)
        marker = read_mode(nb)
        status, error = entry.get("status", "?"), entry.get("error") or said
        mode = marker["mode"] if marker else "cpu"
    if status != "ok":
        pytest.fail(f"{ipynb.name} failed: {error}\n\n--- all cell outputs ---\n{outputs_text(nb)}",
                    pytrace=False)
    assert mode in {"live", "recorded"}, f"{ipynb.name} shows no Workbook banner"
    # a cell ending in a call that shows its own output must not echo what it returns as well
    echoed = [
        i for i, c in enumerate(nb.cells) if c.cell_type == "code" for o in c.get("outputs", [])
        if o.get("output_type") == "execute_result" and set(o.get("data", {})) == {"text/plain"}
        and re.match(r"[A-Z]\w*\(", o["data"]["text/plain"])
    ]
    assert not echoed, f"{ipynb.name}: cells {echoed} echo an object's raw repr"
    # a cell that does not apply is blank, not NaN (checked on the committed runs a reader sees)
    if mode == "recorded":
        text = outputs_text(nb)
        assert "NaN" not in text and "<NA>" not in text, f"{ipynb.name} prints NaN or <NA>"


def test_readme_index_matches_recorded_runs():
    from sglab.tools import readme

    block = readme.current_block((ROOT / "README.md").read_text())
    assert block is not None, "README.md lost its index markers"
    assert block == readme.index_block(), \
        "README index is stale: run `sglab index` and commit README.md"


def test_house_map_matches_the_tree():
    """docs/structure.md's module list is generated from lib/sglab's docstrings."""
    from sglab.tools import readme

    text = (ROOT / "docs" / "structure.md").read_text()
    assert readme.current_block(text, readme.MAP_START, readme.MAP_END) == readme.house_block(), \
        "stale: run `sglab index` and commit docs/structure.md"


def test_engine_ledger_matches_the_recorded_runs():
    """docs/operating.md's ledger of engine runs is generated from data/recorded/engine_*."""
    from sglab.tools import ledger, readme

    text = (ROOT / "docs" / "operating.md").read_text()
    assert readme.current_block(text, ledger.START, ledger.END) == ledger.block(), \
        "stale: run `sglab index` and commit docs/operating.md"
