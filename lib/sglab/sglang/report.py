"""The pieces every "real SGLang, before and after" section shares: run a probe on the releases, say which did
not run and why, check the rows against the rebuild loudly, and show a recorded GPU run of real code if one exists.

A comparison is a DataFrame with one row per (release, case) and a boolean ``agrees`` column computed from the
real rows and the rebuild; :func:`check` prints every disagreeing row under a banner (a notebook reader cannot
miss it) and returns whether all agreed, so a test can assert it. Nothing here imports SGLang.
"""

from __future__ import annotations

from typing import Iterable, Optional

from sglab.sglang.runner import ProbeResult, run_probes

MISMATCH = "!!! REAL SGLANG AND THE REBUILD DISAGREE"


def run(releases: Iterable[str], probe: str, params: Optional[dict] = None) -> dict[str, ProbeResult]:
    """Each release's answer: from the recording where it holds it (``SGLAB_REAL=auto``, the default), else run
    now, each release in its own subprocess (two at a time: the CPU box has two cores); see
    :mod:`sglab.sglang.store`."""
    return run_probes(releases, probe, params, jobs=2)


def source_line(results: dict[str, ProbeResult]) -> str:
    """Where the answers come from, in one line: a recording (which one) or this machine, now."""
    labels = sorted({r.recorded for r in results.values() if r.recorded})
    now = [v for v, r in results.items() if not r.recorded]
    parts = []
    if labels:
        parts.append(f"answers {'; '.join(labels)} (SGLAB_REAL=live runs the installed releases here instead)")
    if now:
        parts.append(f"run here now: {', '.join(now)}")
    return "real SGLang: " + " · ".join(parts) if parts else "real SGLang: no release asked"


def not_run_lines(results: dict[str, ProbeResult]) -> list[str]:
    """One ``sglang V: not run: <reason>`` line per release that did not run (missing, import failed, raised)."""
    return [f"sglang {v}: not run: {r.reason.removeprefix(f'sglang {v}: ')}" for v, r in results.items()
            if not r.ok]


def status_lines(results: dict[str, ProbeResult]) -> str:
    """Where the answers come from (:func:`source_line`), then one line per release: how long it ran and with
    which shims, or why it did not run."""
    lines = [r.summary(with_source=False) if r.ok else f"sglang {v}: not run: {r.reason.removeprefix(f'sglang {v}: ')}"
             for v, r in results.items()]
    return "\n".join([source_line(results), *lines])


def ran(results: dict[str, ProbeResult]) -> dict[str, ProbeResult]:
    return {v: r for v, r in results.items() if r.ok}


def check_table(table, *, what: str = "rows") -> bool:
    """Print a loud banner with every row whose ``agrees`` is False; True when every row agrees (and there is at
    least one row: an empty comparison proves nothing and says so)."""
    if table is None or len(table) == 0:
        print(f"no real release ran, so nothing was compared ({what})")
        return False
    bad = table[~table["agrees"].astype(bool)]
    if len(bad):
        print(f"{MISMATCH}: {len(bad)} of {len(table)} {what}\n{bad.to_string(index=False)}")
        return False
    print(f"real SGLang and the rebuild agree on all {len(table)} {what}")
    return True


def recorded_summary(fix: str) -> tuple[Optional[str], object]:
    """(one header line, the run's table without its constant columns) of :func:`recorded`, or a "not recorded
    yet" line and None."""
    run_ = recorded(fix)
    if run_ is None:
        return (f"GPU run of real SGLang: not recorded yet (data/recorded/real_{fix}/ holds no run)", None)
    m, params = run_.manifest, run_.manifest.get("params") or {}
    releases = params.get("releases") or (sorted(set(map(str, run_.df["release"])))
                                          if "release" in run_.df.columns else "?")
    shims = params.get("shims")
    line = f"GPU run of real SGLang: {run_.path.name} ({run_.provenance}); releases {releases}"
    if shims:
        line += f"; shims {shims}"
    from sglab.sglang.gpu.summary import tables

    return line, tables(fix, run_.df)
