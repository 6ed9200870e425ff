"""The workbook's notebooks in reading order, and the one list of its fixes.

Each fix states its record once (``FIX`` in ``sglab.<fix>.sglang``); this module only puts them in
order and finds a fix's other modules by name for the command line, the report and the README index.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Optional

from sglab.breakable_graph.sglang import FIX as _breakable_graph
from sglab.capture_sizes.sglang import FIX as _capture_sizes
from sglab.grid_thw.sglang import FIX as _grid_thw
from sglab.pcg_gate.sglang import FIX as _pcg_gate
from sglab.sglang.fix import Fix
from sglab.swa_loc.sglang import FIX as _swa_loc
from sglab.workspace_floor.sglang import FIX as _workspace_floor


FIXES: tuple[Fix, ...] = (_pcg_gate, _workspace_floor, _breakable_graph, _swa_loc, _grid_thw,
                          _capture_sizes)
NAMES = tuple(f.name for f in FIXES)
START = "00_start_here"
START_CLAIM = ("What the workbook is, what this machine can run live, and how recorded runs stand "
               "in for GPUs.")
METHODS = "07_how_we_measure"
METHODS_CLAIM = ("How every fix's engine numbers are made to repeat (interleaved starts, the A/A "
                 "control, the host beside each run, reruns on other machines) and how far to "
                 "trust them.")


class UnknownFix(ValueError):
    """A name that is no fix of the workbook (the message lists the known ones)."""


def get(name: str) -> Fix:
    for f in FIXES:
        if f.name == name:
            return f
    raise UnknownFix(f"unknown fix {name!r}; known: {', '.join(NAMES)}")


def _module(name: str, part: str):
    get(name)
    return importlib.import_module(f"sglab.{name}.{part}")


def claims(name: str):
    """``sglab.<name>.claims``; for ``engine_<name>`` (the real engine's runs) its ``ENGINE``."""
    if name.startswith("engine_"):
        return _module(name.removeprefix("engine_"), "claims").ENGINE
    return _module(name, "claims")


def card(name: str, live: list | tuple = ()) -> dict:
    """The review card of fix ``name`` over its shown (or ``live``) runs."""
    from sglab.core import card as K, claims as C, runs

    mod, fix = claims(name), get(name)
    shown = list(live) or C.shown(mod, runs.load_all_recorded(name))
    rs = runs.RunSet(shown, experiment=name) if shown else runs.NoRun(name, "none recorded")
    return K.parts(mod.CARD, fix, mod, rs, fix.recorded_engine())


def experiments() -> tuple[str, ...]:
    """What ``sglab verify`` checks: each fix, then ``engine_<fix>`` where it has ``ENGINE``."""
    return NAMES + tuple(f"engine_{n}" for n in NAMES if hasattr(claims(n), "ENGINE"))


def measure(name: str):
    """``sglab.<name>.measure``."""
    return _module(name, "measure")


@dataclass(frozen=True)
class Notebook:
    """One notebook of the workbook: a fix's, or one without a fix (00, 07) and what it is for."""

    number: str
    stem: str
    fix: Optional[Fix]
    about: str = ""

    @property
    def experiment(self) -> Optional[str]:
        return self.fix.name if self.fix else None

    @property
    def gpus(self) -> int:
        return self.fix.gpus if self.fix else 0

    @property
    def upstream(self) -> str:
        return self.fix.upstream if self.fix else "-"

    @property
    def claim(self) -> str:
        return claims(self.fix.name).CLAIM if self.fix else self.about


NOTEBOOKS: tuple[Notebook, ...] = (Notebook("00", START, None, START_CLAIM),
                                   *(Notebook(f.number, f.stem, f) for f in FIXES),
                                   Notebook("07", METHODS, None, METHODS_CLAIM))


def by_stem(stem: str) -> Optional[Notebook]:
    return next((e for e in NOTEBOOKS if e.stem == stem), None)


def scenarios() -> tuple:
    """Every fix's real-engine scenarios (:class:`sglab.sglang.engine.Scenario`), in order."""
    return tuple(s for f in FIXES for s in (f.engine or ()))


def adjustments() -> tuple:
    """Every harness adjustment the fixes' scenarios build, once each (for ``--adjust``)."""
    seen = {}
    for a in (a for sc in scenarios() for c in sc.cases for a in c.adjustments):
        if not isinstance(a, str):
            seen.setdefault(a.name, a)
    return tuple(seen.values())


def scenario(name: str):
    found = {s.name: s for s in scenarios()}
    if name not in found:
        raise KeyError(f"unknown scenario {name!r} (known: {', '.join(found)})")
    return found[name]


def plan(number: str) -> list:
    """The scenarios of one notebook (``"01"``)."""
    return [s for s in scenarios() if s.name.startswith(f"{number}-")]


def short_of(name: str, need: int, have: int | None) -> str:
    """Why a machine of ``have`` GPUs cannot run ``name`` ('' when it can)."""
    if have is None or need <= have:
        return ""
    return f"{name} needs {need} GPUs, this machine has {have}"


def plan_for(number: str, gpus: int | None) -> tuple[list, list[str]]:
    """The scenarios of one notebook a machine of ``gpus`` GPUs can run, and those it skips."""
    why = {s.name: short_of(s.name, s.gpus, gpus) for s in plan(number)}
    return [s for s in plan(number) if not why[s.name]], [f"skipped {w}" for w in why.values() if w]
