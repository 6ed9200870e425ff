"""The generated blocks of the docs: the README's notebook index, the house map of
``docs/structure.md`` and the ledger of recorded engine runs in ``docs/operating.md``.
``sglab index`` rewrites each block between its markers; tests check them current."""

from __future__ import annotations

import ast
from pathlib import Path

from sglab.core import card, runs
from sglab.tools import fixes, ledger


START, END = "<!-- index:start -->", "<!-- index:end -->"
HEADER = ("| notebook | upstream | its card: the bug, releases, real engine, rebuild (computed "
          "from data/recorded/) | GPUs |\n|---|---|---|---|")
MAP_START, MAP_END = "<!-- house:start -->", "<!-- house:end -->"
LAYERS = ("tools", *fixes.NAMES, "sglang", "core")  # top to bottom: imports only go down


def row(e: fixes.Notebook) -> str:
    """A notebook's row: its review card's summary, or its claim (00, 07)."""
    text = card.summary(fixes.card(e.experiment)) if e.experiment else e.claim
    text = " ".join(str(text).split()).replace("|", "\\|")
    return f"| `{e.stem}` | {e.upstream} | {text} | {e.gpus if e.gpus < 2 else f'{e.gpus}–4'} |"


def index_block() -> str:
    return "\n".join([START, HEADER, *(row(e) for e in fixes.NOTEBOOKS), END])


def _summary(path: Path, width: int = 72) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    first = " ".join(doc.split("\n\n")[0].split())
    first = first.split(". ")[0].rstrip(".").replace("``", "`")
    return first if len(first) <= width else first[:width - 1].rsplit(" ", 1)[0] + " …"


def house_block() -> str:
    """``lib/sglab`` as a tree, each module with its docstring's first sentence."""
    lines = [MAP_START, "```"]
    for layer in LAYERS:
        folder = runs.repo_root() / "lib" / "sglab" / layer
        lines.append(f"{layer}/  {_summary(folder / '__init__.py', 96 - len(layer))}".rstrip())
        for p in sorted(folder.rglob("*.py")):
            if p != folder / "__init__.py":
                lines.append(f"  {p.relative_to(folder).as_posix():<24} {_summary(p)}")
    lines += ["```", MAP_END]
    return "\n".join(lines)


def current_block(text: str, start: str = START, end: str = END) -> str | None:
    if start not in text or end not in text:
        return None
    return text[text.index(start):text.index(end) + len(end)]


class MissingMarker(ValueError):
    """A generated block's file lacks one of its markers: nothing can be put between them."""


def _blocks() -> list[tuple]:
    """``(file, start, end, its block, what it is)`` of every generated block, markers checked."""
    root = runs.repo_root()
    found = [(root / "README.md", START, END, index_block, "README.md index (from data/recorded/)"),
             (root / "docs" / "structure.md", MAP_START, MAP_END, house_block,
              "docs/structure.md house map (from lib/sglab)"),
             (root / "docs" / "operating.md", ledger.START, ledger.END, ledger.block,
              "docs/operating.md engine ledger (from data/recorded/engine_*)")]
    for path, start, end, *_ in found:
        text = path.read_text() if path.exists() else ""
        for marker in (m for m in (start, end) if m not in text):
            raise MissingMarker(
                f"{path.relative_to(root)} has no {marker} marker: put it back where its generated "
                f"block {'starts' if marker == start else 'ends'} (`sglab index` writes between "
                f"{start} and {end})")
    return found


def write_index() -> bool:
    """Rewrite the README index, the house map and the engine ledger; True when any changed."""
    changed = False
    for path, start, end, new, _ in _blocks():
        text = path.read_text()
        old, block = current_block(text, start, end), new()
        if block != old:
            path.write_text(text.replace(old, block))
            changed = True
    return changed


def stale() -> list[str]:
    """What ``sglab index --check`` reports: the blocks that differ from what they should say."""
    return [
        what for path, a, b, new, what in _blocks()
        if current_block(path.read_text() if path.exists() else "", a, b) != new()
    ]
