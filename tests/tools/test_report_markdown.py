"""No stray headings: a markdown line that starts with ``#`` is a heading in Markdown, even in the
middle of a paragraph (a wrapped "… later PRs removed it (\n#25824, …" became a huge H1 in the
report). Headings belong on their own, after a blank line; an H1 only as the notebook's title. The
notebooks' markdown cells and the markdown the workbook prints (first screens, banners) are both
checked."""

import re
from pathlib import Path

import jupytext
import pytest

from sglab.tools import fixes as catalog
from sglab.tools import fixes
from sglab.core import claims, runs
from sglab.core import notebook as nbmod


ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
HASH_LINE = re.compile(r"^ {0,3}#")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+\S")


def stray_headings(markdown: str, *, title_allowed: bool) -> list[str]:
    """Lines of ``markdown`` (outside code fences) that start with ``#`` but are not a heading
    standing on its own (first line or after a blank line), and H1s other than an allowed title."""
    problems, fence, prev = [], False, ""
    for ln in markdown.splitlines():
        if ln.lstrip().startswith(("```", "~~~")):
            fence = not fence
        elif not fence and HASH_LINE.match(ln):
            m = HEADING.match(ln)
            if not m:
                problems.append(f"not a heading, but starts with '#': {ln!r}")
            elif prev.strip():
                problems.append(f"heading in the middle of a paragraph: {ln!r}")
            elif len(m.group(1)) == 1 and not title_allowed:
                problems.append(f"an H1 that is not the notebook's title: {ln!r}")
            title_allowed = False  # the title, if any, is the first heading
        prev = ln
    return problems


def test_the_check_catches_the_traps():
    wrapped = "later PRs removed it in favour of a location passed with each write\n#25824, #27091."
    assert stray_headings(wrapped, title_allowed=False)
    assert stray_headings("text\n# 24743 zeroes the tail", title_allowed=False)
    assert stray_headings("## Section\n\n# Second title", title_allowed=True)
    assert not stray_headings("# Title\n\nText #24743.\n\n## Section\n\n```\n# a comment\n```",
                              title_allowed=True)


@pytest.mark.parametrize("py", SOURCES, ids=lambda p: p.stem)
def test_notebook_markdown_has_no_stray_headings(py):
    nb = jupytext.read(py)
    problems, first = [], True
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        problems += [
            f"{py.name} markdown cell {i}: {p}"
            for p in stray_headings(cell.source, title_allowed=first)
        ]
        first = False
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("experiment", [e.experiment for e in catalog.NOTEBOOKS if e.experiment])
def test_printed_markdown_has_no_stray_headings(experiment, monkeypatch):
    mod = fixes.claims(experiment)
    printed = []
    monkeypatch.setattr(nbmod, "display", lambda data, txt, md=None: printed.append(md or ""))
    nbmod.Workbook(mod, gpus=0, mode="recorded")
    for md in printed:
        assert not stray_headings(md, title_allowed=False), md
