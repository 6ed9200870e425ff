"""For tests of real releases: results that must exist in CI and may be missing on a developer's
machine.

In CI (``CI`` set) a release that did not run fails the test with its one-line reason: CI installs
the releases through the project's own steps, so a missing one is a defect. Elsewhere the test is
skipped with that reason (run ``sglab real install`` or ``make test``, which installs them).

Live answers in a test session come from one run of each release for all the calls that the
session's test modules name (``REAL_CALLS`` in ``tests/conftest.py``,
:func:`sglab.sglang.runner.session_answers`).
"""

from __future__ import annotations

import os
import re

from sglab.sglang.releases import package_dir, release_installed  # noqa: F401 (for tests)
from sglab.sglang.runner import DEFAULT_TIMEOUT_S, ProbeResult, run_probes


def require(result: ProbeResult) -> ProbeResult:
    """``result`` when it ran; otherwise fail (CI) or skip (elsewhere) with its reason."""
    import pytest

    if result.ok:
        return result
    reason = result.reason if result.status == "not-run" else f"{result.reason}\n{result.traceback}"
    if os.environ.get("CI"):
        pytest.fail(f"real SGLang did not run: {reason}", pytrace=False)
    pytest.skip(f"real SGLang did not run: {reason}")


def package(release: str):
    """The installed release's ``sglang`` folder (its source, read as text); fail (CI) or skip
    (elsewhere) when it is not installed."""
    import pytest

    if release_installed(release):
        return package_dir(release)
    reason = f"sglang {release} is not installed (sglab real install --releases {release})"
    if os.environ.get("CI"):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def probe_all(releases, probe: str, params=None) -> dict[str, ProbeResult]:
    """Each release's live answer: this test session's, else run now (never a recording; two workers
    at a time, the machine has two cores)."""
    return run_probes(releases, probe, params, jobs=2, source="live")


def probe_one(release: str, probe: str, params=None, *,
              timeout: float = DEFAULT_TIMEOUT_S) -> ProbeResult:
    """One release's live answer, as :func:`probe_all` gives it."""
    return run_probes([release], probe, params, jobs=1, timeout=timeout, source="live")[release]


def value(result: ProbeResult, **where):
    """The ``value`` of the single row matching ``where`` (column=value pairs)."""
    df = result.rows
    for col, want in where.items():
        df = df[df[col] == want]
    if len(df) != 1:
        raise AssertionError(f"{result.release}: {len(df)} rows match {where}")
    return df["value"].iloc[0]


def _records(df) -> "object":
    """Rows as they come back from JSON (lists, not tuples; NaN where a row lacks a column), for
    comparing; the times and memory figures inside captured SGLang log lines are masked (they vary
    from run to run)."""
    import json

    import pandas as pd

    records = df.drop(columns=["release", "probe"], errors="ignore").to_dict("records")
    text = json.dumps(records, default=str)
    text = re.sub(r"(elapsed|mem usage|avail mem)(=|: )[0-9.]+", r"\1\2<t>", text)
    return pd.DataFrame(json.loads(text)).reset_index(drop=True)


def assert_recording_matches(live: dict[str, ProbeResult], probe: str, params=None, *,
                             keep=None) -> int:
    """The recording (:mod:`sglab.sglang.store`) answers ``probe`` with ``params`` exactly as the
    releases just did in ``live``: same status and the same rows, release by release. ``keep(rows)
    -> rows`` narrows the live rows first (a probe that answers more than the recorded one). Returns
    how many releases were compared; a recording that holds none of them fails, so a stale or
    missing recording cannot pass unnoticed."""
    import pandas as pd

    from sglab.sglang import store

    rec = store.newest()
    assert rec is not None, "no recording under data/recorded/real_cpu/ (run `sglab real record`)"
    compared = 0
    for release, result in live.items():
        hit = rec.lookup(release, probe, params)
        if hit is None:
            continue
        require(result)
        rows = keep(result.rows) if keep else result.rows
        assert hit.status == result.status, (f"{release}: recorded {hit.status}, live "
                                             f"{result.status}")
        pd.testing.assert_frame_equal(_records(hit.rows), _records(rows), check_dtype=False,
                                      obj=f"{probe} on sglang {release}: recorded vs live rows")
        compared += 1
    assert compared, (f"the recording ({rec.path.name}) holds {probe} for none of "
                      f"{sorted(live)}: re-record it")
    return compared


def hunk_versions() -> list[str]:
    """Both releases of every committed PR hunk's window (``data/upstream/<fix>/pr<N>.json``)."""
    import json

    from sglab.core import runs

    got = set()
    for meta in sorted((runs.repo_root() / "data" / "upstream").glob("*/pr*.json")):
        d = json.loads(meta.read_text())
        got |= {d["before_version"], d["after_version"]}
    return sorted(got)


def fetch_hunk_wheels(dest=None) -> int:
    """Download the wheel of every release a committed hunk's window names into the wheel cache
    (``.sglang/wheels/``; those already there are kept), so that the hunk test can rebuild every
    hunk from the released files. Returns 0, or 1 with one line on stderr where a wheel could not
    be had."""
    import sys
    from pathlib import Path

    from sglab.sglang import wheels

    dest = Path(dest or wheels.cache_dir())
    for v in hunk_versions():
        if wheels.cached(v, dest) is None:
            try:
                wheels.download(v, dest)
            except wheels.NoNetwork as e:
                print(f"hunk wheels: sglang {v}: {e}", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(fetch_hunk_wheels())
