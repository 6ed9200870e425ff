"""TRANSITION (removed once every fix uses sglab.sglang.compare). Real releases beside the rebuild:
one agreement table per notebook, and the recorded real GPU runs.

Every notebook claims that its rebuild behaves like SGLang before and after a fix. The real releases
that straddle the fix can say whether that is true: each row of an agreement table is one release,
what it did (a probe's rows, :mod:`sglab.sglang.runner`), the rebuild variant it must match, what
that variant did, and whether the two agree. ``agrees`` is computed by comparing the facts, never
typed in; a release that did not run says ``not run: <reason>`` and counts neither way. A
disagreement is printed loudly, and :func:`status` turns it into ``fail`` so a test (or a reader)
cannot miss it.

GPU runs of the real code are recorded like every other run, as the experiment ``real_<fix>``
(:mod:`sglab.core.runs`); :func:`show_recorded` shows the newest one, or says that none is recorded
yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable
from typing import Iterable, Optional
from sglab.sglang.runner import ProbeResult, run_probes


COLUMNS = ("release", "real behaviour", "rebuild variant", "rebuild behaviour", "agrees")


@dataclass
class Check:
    """One real release (or one case of it) against the rebuild variant it must match."""

    release: str
    behaviour: str                 # what the release did, in words
    variant: str                   # the rebuild's variant
    rebuilt: str                   # what that variant did, in words
    agrees: bool | None            # None: the release did not run
    # the facts that differ, "name: real X, rebuild Y"
    differences: list = field(default_factory=list)

    def as_row(self) -> dict:
        mark = "n/a" if self.agrees is None else ("yes" if self.agrees else "NO")
        return dict(zip(COLUMNS, (self.release, self.behaviour, self.variant, self.rebuilt, mark)))


def compare(real: dict, rebuilt: dict, keys: Iterable[str]) -> list[str]:
    """The facts among ``keys`` on which ``real`` and ``rebuilt`` differ, one line each."""
    return [f"{k}: real {real.get(k)!r}, rebuild {rebuilt.get(k)!r}" for k in keys
            if real.get(k) != rebuilt.get(k)]


def check(release: str, real: dict, variant: str, rebuilt: dict, keys: Iterable[str],
          describe) -> Check:
    """A :class:`Check` from two fact dicts; ``describe(facts) -> str`` puts either side in
    words."""
    diffs = compare(real, rebuilt, keys)
    return Check(release, describe(real), variant, describe(rebuilt), not diffs, diffs)


def not_run(result, variant: str, rebuilt: str) -> Check:
    """The row of a release that did not run (not installed, import failed, the probe raised)."""
    return Check(result.release, f"not run: {result.reason}", variant, rebuilt, None)


def per_release(results: dict, variant_of: dict, one) -> list[Check]:
    """Checks release by release: a release that did not run gets its not-run row; every other one
    gets what ``one(release, result, variant)`` returns (a :class:`Check` or a list of them)."""
    out = []
    for release, r in results.items():
        variant = variant_of.get(release, "-")
        if not r.ok:
            out.append(not_run(r, variant, "-"))
            continue
        got = one(release, r, variant)
        out.extend(got if isinstance(got, list) else [got])
    return out


def facts(result, **where) -> dict:
    """``{metric: value}`` of the probe rows matching ``where`` (column=value pairs)."""
    df = result.rows
    for col, want in where.items():
        df = df[df[col] == want]
    return dict(zip(df["metric"], df["value"]))


def table(checks: list[Check]):
    """One row per check, the columns of :data:`COLUMNS` (index: release)."""
    import pandas as pd

    return pd.DataFrame([c.as_row() for c in checks], columns=list(COLUMNS)).set_index("release")


def status(checks: list[Check]) -> str:
    """``pass`` (every release that ran agrees), ``fail`` (one disagrees), ``n/a`` (none ran)."""
    ran = [c for c in checks if c.agrees is not None]
    if not ran:
        return "n/a"
    return "pass" if all(c.agrees for c in ran) else "fail"


def summary(checks: list[Check], claim: str) -> str:
    """One line for a reader; a disagreement lists what differs, in capitals where it cannot be
    missed."""
    ran = [c for c in checks if c.agrees is not None]
    skipped = [c.release for c in checks if c.agrees is None]
    tail = f" (not compared: {', '.join(skipped)})" if skipped else ""
    st = status(checks)
    if st == "n/a":
        return f"n/a: no real release ran, so nothing checks that {claim}{tail}"
    if st == "pass":
        return f"agrees: {len(ran)}/{len(ran)} real release rows match the rebuild, so {claim}{tail}"
    lines = [f"MISMATCH: the real release disagrees with the rebuild; the claim that {claim} does "
             "not hold as built"]
    for c in ran:
        if not c.agrees:
            lines += [f"  {c.release} vs {c.variant}: {d}" for d in c.differences]
    return "\n".join(lines) + tail


def show(checks: list[Check], claim: str) -> str:
    """Display the table and print :func:`summary` (a notebook cell's whole body); returns
    :func:`status`."""
    from IPython.display import display

    display(table(checks))
    print(summary(checks, claim))
    return status(checks)


# -- recorded real GPU runs
# -------------------------------------------------------------------------------------
def recorded(fix: str):
    """The newest recorded run of ``real_<fix>`` (``data/recorded/real_<fix>/``), or None."""
    from sglab.core import runs

    return runs.load_recorded(f"real_{fix}")


def recorded_lines(run) -> list[str]:
    """Where a recorded real run came from: GPU, date, and per release the shims it ran with."""
    m = run.manifest
    p = m.get("params") or {}
    lines = [f"{run.label} · {run.path.name} · method {m.get('method_version')}"]
    releases = p.get("releases") or m.get("sglang_releases") or []
    shims = p.get("shims") or m.get("shims") or {}
    if releases:
        lines.append("releases: " + ", ".join(map(str, releases)))
    if isinstance(shims, dict) and shims:
        lines += [f"  shims {v}: {', '.join(map(str, s)) if isinstance(s, list) else s}" for v,
                  s in shims.items()]
    return lines


def recorded_table(run):
    """The run's rows, one line per release × case × metric where the run has those columns."""
    df = run.df
    keys = [c for c in ("release", "variant", "case", "metric") if c in df.columns]
    if keys and "value" in df.columns and not df.duplicated(keys).any():
        return df.set_index(keys)[[c for c in df.columns if c not in keys]]
    return df


def show_recorded(fix: str) -> bool:
    """Show the newest recorded real GPU run of ``fix``, or say plainly that there is none. True
    when shown."""
    from IPython.display import display

    run = recorded(fix)
    if run is None:
        print(f"Real SGLang on a GPU ({fix}): not recorded yet (no run under "
              f"data/recorded/real_{fix}/).")
        return False
    from sglab.sglang.compare_old import tables

    print("\n".join(["Real SGLang on a GPU, recorded:"] + recorded_lines(run)))
    for name, table in tables(fix, run.df).items():
        print(name)
        display(table)
    return True


def show_as_released(fix: str, rebuilt, *, symbol: str | None = None) -> None:
    """The fix's row of the release timeline, then the released ``symbol`` (first release with the
    fix) beside the rebuilt function or class: what the notebook claims, next to what shipped."""
    import matplotlib.pyplot as plt
    from IPython.display import display

    from sglab.sglang import wheels as figures, hunks

    figures.timeline_row_figure(fix)
    plt.show()
    display(hunks.beside(fix, rebuilt, symbol=symbol))


# --------------------------------------------------------------------------------------------------
# report: The pieces every "real SGLang, before and after" section shares: run a probe on the rel
# --------------------------------------------------------------------------------------------------


MISMATCH = "!!! REAL SGLANG AND THE REBUILD DISAGREE"


def run(releases: Iterable[str], probe: str, params: Optional[dict] = None) -> dict[str,
        ProbeResult]:
    """Each release's answer: from the recording where it holds it (``SGLAB_REAL=auto``, the
    default), else run now, each release in its own subprocess (two at a time: the CPU box has two
    cores); see :mod:`sglab.sglang.store`."""
    return run_probes(releases, probe, params, jobs=2)


def source_line(results: dict[str, ProbeResult]) -> str:
    """Where the answers come from, in one line: a recording (which one) or this machine, now."""
    labels = sorted({r.recorded for r in results.values() if r.recorded})
    now = [v for v, r in results.items() if not r.recorded]
    parts = []
    if labels:
        parts.append(f"answers {'; '.join(labels)} (SGLAB_REAL=live runs the installed releases "
                     "here instead)")
    if now:
        parts.append(f"run here now: {', '.join(now)}")
    return "real SGLang: " + " · ".join(parts) if parts else "real SGLang: no release asked"


def not_run_lines(results: dict[str, ProbeResult]) -> list[str]:
    """One ``sglang V: not run: <reason>`` line per release that did not run (missing, import
    failed, raised)."""
    return [f"sglang {v}: not run: {r.reason.removeprefix(f'sglang {v}: ')}" for v,
            r in results.items() if not r.ok]


def status_lines(results: dict[str, ProbeResult]) -> str:
    """Where the answers come from (:func:`source_line`), then one line per release: how long it ran
    and with which shims, or why it did not run."""
    lines = [r.summary(with_source=False) if r.ok
             else f"sglang {v}: not run: {r.reason.removeprefix(f'sglang {v}: ')}" for v,
             r in results.items()]
    return "\n".join([source_line(results), *lines])


def ran(results: dict[str, ProbeResult]) -> dict[str, ProbeResult]:
    return {v: r for v, r in results.items() if r.ok}


def check_table(table, *, what: str = "rows") -> bool:
    """Print a loud banner with every row whose ``agrees`` is False; True when every row agrees (and
    there is at least one row: an empty comparison proves nothing and says so)."""
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
    """(one header line, the run's table without its constant columns) of :func:`recorded`, or a
    "not recorded yet" line and None."""
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
    from sglab.sglang.compare_old import tables

    return line, tables(fix, run_.df)


# --------------------------------------------------------------------------------------------------
# summary: What a recorded real-SGLang GPU run says, in the shape a reader compares with the rebu
# --------------------------------------------------------------------------------------------------


SUMMARIES: dict = {}


def tables(fix: str, df) -> dict:
    """Named tables for ``fix``'s recorded run; the tidy rows when the fix has no summary or its
    rows do not fit."""
    fn = SUMMARIES.get(fix)
    if fn is not None:
        try:
            return fn(df)
        except (KeyError, ValueError):
            pass
    return {"rows": df.drop(columns=[c for c in ("experiment",) if c in df.columns])}
