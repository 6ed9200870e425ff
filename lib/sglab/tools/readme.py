"""The README's notebook index, generated from the notebooks (:mod:`sglab.tools.fixes`) and the
committed recorded runs.

Each row is the catalog's claim followed by the experiment's headline over the runs a reader is
shown, both from :mod:`sglab.core.claims` (the same sentence a notebook's first screen shows;
numbers computed, never typed in). ``sglab index`` rewrites the block between the markers in
README.md; a test checks that the committed README matches what the committed runs say.
"""

from __future__ import annotations

from pathlib import Path

from sglab.core import claims, runs
from sglab.tools import fixes

START, END = "<!-- index:start -->", "<!-- index:end -->"
HEADER = ("| notebook | upstream | claim · headline (computed from data/recorded/) | GPUs |\n"
          "|---|---|---|---|")


def _gpus(e: fixes.Notebook) -> str:
    return {0: "0", 1: "1"}.get(e.gpus, f"{e.gpus}–4")


def row(e: fixes.Notebook) -> str:
    text = e.claim
    if e.experiment:
        mod = fixes.claims(e.experiment)
        shown = claims.shown(mod, runs.load_all_recorded(e.experiment))
        text = f"{e.claim} {claims.headline(mod, shown)}" if shown else text + " (no recorded run yet)"
    text = " ".join(str(text).split()).replace("|", "\\|")
    return f"| `{e.stem}` | {e.upstream} | {text} | {_gpus(e)} |"


def index_block() -> str:
    return "\n".join([START, HEADER, *(row(e) for e in fixes.NOTEBOOKS), END])


def readme_path() -> Path:
    return runs.repo_root() / "README.md"


def current_block(text: str) -> str | None:
    if START not in text or END not in text:
        return None
    a = text.index(START)
    return text[a:text.index(END) + len(END)]


def write_index() -> bool:
    """Rewrite the README index; return True when it changed."""
    path = readme_path()
    text = path.read_text()
    old = current_block(text)
    if old is None:
        raise RuntimeError(f"README.md has no {START} … {END} block")
    new = index_block()
    if new == old:
        return False
    path.write_text(text.replace(old, new))
    return True
