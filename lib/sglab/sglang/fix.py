"""A fix's record, ``FIX`` in ``sglab.<fix>.sglang``: its source check (``check(read) -> Verdict``),
the symbols each PR touched (``hunks``), its notebook's real-release probe (``probe``) and the real
engine's scenarios (``engine``). No module of ``sglab.sglang`` imports a fix; an engine adjustment
may name a fix's patch by its dotted path (``spec.ADJUSTMENTS``: 05's processor stand-in), which
only the engine's own processes import."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional


REPO = "sgl-project/sglang"


@dataclass(frozen=True)
class Spec:
    """What a PR touched (``"srt/<file>.py::Qual.name"``); ``first_with(read)``: in a release?"""

    pr: int
    symbols: tuple[str, ...]
    first_with: Optional[Callable] = None


def symbols_in(path: str, *names: str) -> tuple[str, ...]:
    """``("srt/x.py::A.f", ...)`` for names in one file."""
    return tuple(f"{path}::{n}" for n in names)


@dataclass(frozen=True)
class Probe:
    """A real-release probe: ``fn`` (``module:function``) asked with ``params`` of ``releases``."""

    fn: str
    releases: tuple[str, ...]
    params: object = None  # a dict, or a function that returns one (the rebuild's defaults)

    def resolved_params(self) -> Optional[dict]:
        return self.params() if callable(self.params) else self.params


@dataclass(frozen=True)
class Fix:
    """One upstream fix as the workbook treats it (see the module docstring)."""

    name: str  # folder, experiment, data/recorded/<name>/, data/upstream/<name>/
    number: str  # the notebook's number ("04")
    title: str  # what the check decides, in a line
    prs: tuple[int, ...]  # the upstream PRs, the main one first
    gpus: int  # GPUs the live measurement needs
    check: Callable  # read -> Verdict (sglab.sglang.upstream)
    hunks: tuple[Spec, ...] = ()
    probe: Optional[Probe] = None
    engine: object = None
    part: str = ""  # "part A" where one PR holds two fixes
    # (what a release's check reason says, how a reader is told): a release with the main PR but
    # not its follow-up, told apart on the card though its state is the PR's
    lacking: tuple = ()

    @property
    def stem(self) -> str:
        return f"{self.number}_{self.name}"

    @property
    def upstream(self) -> str:
        """``sgl-project/sglang#23552, #24743`` (with the part, where there is one)."""
        text = f"{REPO}#{self.prs[0]}" + "".join(f", #{p}" for p in self.prs[1:])
        return f"{text} ({self.part})" if self.part else text

    @property
    def experiment(self) -> str:
        return self.name

    def releases(self, told: bool = False) -> list[tuple[str, str]]:
        """``[(version, state)]`` of this fix in every release (``told``: :attr:`lacking` said)."""
        from sglab.sglang import wheels

        row = wheels.timeline_row(self.name)
        states = list(row["state"])
        if told and self.lacking:
            marker, words = self.lacking
            states = [words if marker in r else s for s, r in zip(states, row["reason"])]
        return list(zip(row["version"], states))

    def recorded_engine(self):
        """This fix's recorded real-engine runs, or a NoRun saying how to record them."""
        from sglab.core import engine_records  # here: release workers, which never read it, skip it

        return engine_records.load(self.name, self.number)
