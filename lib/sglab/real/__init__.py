"""Real SGLang releases, side by side, each run in its own subprocess.

- :mod:`~sglab.real.releases` pinned releases and where they live (``.sglang/releases/<V>/``)
- :mod:`~sglab.real.install`  ``sglab real install``: pip into target folders, idempotent, in parallel
- :mod:`~sglab.real.shims`, :mod:`~sglab.real.bootstrap`  the stand-ins a release needs on this machine
- :mod:`~sglab.real.worker`, :mod:`~sglab.real.runner`  one subprocess per release: :func:`run_probe`
- :mod:`~sglab.real.probes`   the real code of each fix, driven on the CPU; rows for the tests and notebooks

Nothing here imports SGLang into the calling process.
"""

from __future__ import annotations

from functools import lru_cache

from .releases import PINNED, home, installed_releases, package_dir, release_dir
from .runner import ProbeResult, run_probe, run_probes


@lru_cache(maxsize=1)
def _facts() -> dict:
    from .bootstrap import facts_in_subprocess

    return facts_in_subprocess()


def shims_needed(release: str) -> list[str]:
    """Names of the shims ``release`` needs on this machine (decided by a fresh interpreter, as a worker would)."""
    from .bootstrap import plan

    return plan(release, _facts())


__all__ = ["PINNED", "ProbeResult", "home", "installed_releases", "package_dir", "release_dir", "run_probe",
           "run_probes", "shims_needed"]
