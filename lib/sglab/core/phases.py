"""Where live time goes: wall seconds per named phase of a run (process spawn, CUDA init, capture, timing, ...).

    with phases.phase("capture"):
        runner.capture()
    phases.take()          # {"capture": 1.84, ...} accumulated in this process since the last take()

An experiment's ``run`` wraps its phases; :func:`sglab.tools.cli.record` and :meth:`sglab.core.notebook.Workbook.measure`
store them in the run manifest (``phases_s``), and ``sglab run --timings`` reports them per notebook. Ranks of a
multi-process run return their own ``take()`` with their rows; the launcher adds them under ``rank<N>/``.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

_totals: dict[str, float] = {}


@contextmanager
def phase(name: str):
    """Add the wall time of the block to phase ``name`` (nested phases are counted in both)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        _totals[name] = _totals.get(name, 0.0) + time.perf_counter() - t0


def add(name: str, seconds: float) -> None:
    _totals[name] = _totals.get(name, 0.0) + float(seconds)


def merge(other: dict, prefix: str = "") -> None:
    """Fold another process's phases (e.g. a rank's) into this one's, under ``prefix``."""
    for k, v in (other or {}).items():
        add(prefix + k, v)


def take() -> dict:
    """The phases since the last take(), rounded to ms; resets the clock."""
    out = {k: round(v, 3) for k, v in _totals.items()}
    _totals.clear()
    return out
