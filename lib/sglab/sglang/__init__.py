"""Real SGLang releases, side by side, each run in its own subprocess.

- :mod:`~sglab.sglang.releases` pinned releases and where they live (``.sglang/releases/<V>/``)
- :mod:`~sglab.sglang.install`  ``sglab real install``: pip into target folders, idempotent, in
  parallel
- :mod:`~sglab.sglang.bootstrap`, :mod:`~sglab.sglang.bootstrap`  the stand-ins a release needs on
  this machine
- :mod:`~sglab.sglang.runner`  one worker per release, for all its calls: :func:`run_probes`
- :mod:`~sglab.sglang.probes`   the real code of each fix, driven on the CPU; rows for the tests and notebooks
- :mod:`~sglab.sglang.engine`   a release's whole engine on a GPU (``sglab engine``; scenarios in
  :mod:`~sglab.sglang.engine_plans`)

Nothing here imports SGLang into the calling process.
"""

from __future__ import annotations

from functools import lru_cache

from sglab.sglang.releases import PINNED, home, installed_releases, package_dir, release_dir
from sglab.sglang.runner import ProbeResult, run_batch, run_probe, run_probes, run_release


@lru_cache(maxsize=1)
def _facts() -> dict:
    from sglab.sglang.bootstrap import facts_in_subprocess

    return facts_in_subprocess()


def shims_needed(release: str) -> list[str]:
    """Names of the shims ``release`` needs on this machine (decided by a fresh interpreter, as a
    worker would)."""
    from sglab.sglang.bootstrap import plan

    return plan(release, _facts())


def real_release_rows() -> list[tuple[str, str]]:
    """``sglab env`` rows: the installed releases (``.sglang/releases``) and the shims each needs on
    this machine."""
    have = installed_releases()
    missing = [v for v in PINNED if v not in have]
    head = f"{len(have)} in {home()}" + (f"; missing {', '.join(missing)} (`sglab real install`)"
                                         if missing else "")
    return [("sglang releases", head)] + [(f"  {v}",
                                           "shims: " + (", ".join(shims_needed(v)) or "none"))
                                          for v in have]


__all__ = ["PINNED", "real_release_rows", "ProbeResult", "home",
           "installed_releases", "package_dir", "release_dir", "run_batch", "run_probe",
           "run_probes", "run_release", "shims_needed"]
