"""The command-line examples in docs/operating.md that read the recorded runs print today what the
docs show: a new recorded run that changes them must come with the docs' new text."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from sglab.tools import cli


ROOT = Path(__file__).resolve().parents[2]
# the examples whose output moves with data/recorded/ (capture-sizes reads only the releases)
COMMANDS = ("sglab workspace", "sglab swa-cost")


def _examples() -> list[tuple[str, str]]:
    """``(command line, output)`` of each ```text block in docs/operating.md that starts with one
    of :data:`COMMANDS`."""
    out = []
    for block in (ROOT / "docs" / "operating.md").read_text().split("```text\n")[1:]:
        body = block.split("```", 1)[0]
        first, _, rest = body.partition("\n")
        if first.startswith("$ ") and first[2:].startswith(COMMANDS):
            out.append((first[2:], rest))
    return out


def test_the_docs_show_each_example():
    assert {c.split()[1] for c, _ in _examples()} == {c.split()[1] for c in COMMANDS}


@pytest.mark.parametrize("command, shown", _examples(), ids=[c.split()[1] for c, _ in _examples()])
def test_an_example_prints_what_the_docs_show(command, shown, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert cli.main(shlex.split(command)[1:]) == 0
    printed = capsys.readouterr().out
    assert [ln.rstrip() for ln in printed.splitlines()
            ] == [ln.rstrip() for ln in shown.splitlines()], printed


def test_the_scenario_table_lists_every_scenario_engine_list_prints():
    """docs/operating.md's table under "Scenarios (`sglab engine --list`)" names each scenario
    once (a new scenario left out of it fails here)."""
    from sglab.tools import fixes

    doc = (ROOT / "docs" / "operating.md").read_text()
    table = doc.split("## Scenarios (`sglab engine --list`)")[1].split("\n\n")[1]
    named = [row.split("`")[1] for row in table.splitlines() if row.startswith("| `")]
    assert sorted(named) == sorted(s.name for s in fixes.scenarios())
