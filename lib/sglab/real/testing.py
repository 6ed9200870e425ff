"""For tests of real releases: results that must exist in CI and may be missing on a developer's machine.

In CI (``CI`` set) a release that did not run fails the test with its one-line reason: CI installs the releases
through the project's own steps, so a missing one is a defect. Elsewhere the test is skipped with that reason
(run ``sglab real install`` or ``make test``, which installs them).
"""

from __future__ import annotations

import os

from .runner import ProbeResult, run_probes


def require(result: ProbeResult) -> ProbeResult:
    """``result`` when it ran; otherwise fail (CI) or skip (elsewhere) with its reason."""
    import pytest

    if result.ok:
        return result
    reason = result.reason if result.status == "not-run" else f"{result.reason}\n{result.traceback}"
    if os.environ.get("CI"):
        pytest.fail(f"real SGLang did not run: {reason}", pytrace=False)
    pytest.skip(f"real SGLang did not run: {reason}")


def probe_all(releases, probe: str, params=None) -> dict[str, ProbeResult]:
    """Each release once (two subprocesses at a time, the machine has two cores)."""
    return run_probes(releases, probe, params, jobs=2)


def value(result: ProbeResult, **where):
    """The ``value`` of the single row matching ``where`` (column=value pairs)."""
    df = result.rows
    for col, want in where.items():
        df = df[df[col] == want]
    if len(df) != 1:
        raise AssertionError(f"{result.release}: {len(df)} rows match {where}")
    return df["value"].iloc[0]
