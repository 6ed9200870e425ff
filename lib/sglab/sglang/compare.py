"""Real releases beside the rebuild: the one comparison every notebook's real-SGLang section makes
(``sglang.compare()`` = :func:`section`), a row per (release, behaviour), real against rebuilt; a
release that did not run counts neither way, a disagreement is printed under a banner."""

from __future__ import annotations

from typing import Callable, Iterable, Optional

from sglab.sglang.runner import ProbeResult, run_probes


COLUMNS = ["release", "behaviour", "real", "must match", "expected", "agrees"]
MISMATCH = "!!! REAL SGLANG AND THE REBUILD DISAGREE"


def row(release: str, behaviour: str, real, must_match: str, expected,
        agrees: Optional[bool] = None) -> dict:
    """One row; ``agrees`` defaults to ``real == expected``."""
    agrees = real == expected if agrees is None else agrees
    return dict(zip(COLUMNS, (release, behaviour, real, must_match, expected, bool(agrees))))


def facts_row(release: str, behaviour: str, real: dict, variant: str, rebuilt: dict,
              keys: Iterable[str], describe: Callable[[dict], str]) -> dict:
    """A row comparing two dicts of facts on ``keys``, those that differ under ``differences``."""
    diffs = [
        f"{k}: real {real.get(k)!r}, rebuild {rebuilt.get(k)!r}"
        for k in keys if real.get(k) != rebuilt.get(k)
    ]
    out = row(release, behaviour, describe(real), f"rebuild: {variant}", describe(rebuilt),
              agrees=not diffs)
    out["differences"] = diffs
    return out


def facts(result: ProbeResult, **where) -> dict:
    """``{metric: value}`` of the probe rows matching ``where`` (column=value pairs)."""
    df = result.rows
    for col, want in where.items():
        df = df[df[col] == want]
    return dict(zip(df["metric"], df["value"]))


def table(rows: list[dict]):
    """The comparison table (:data:`COLUMNS`, plus ``differences`` where a row has them)."""
    import pandas as pd

    extra = ["differences"] if any("differences" in r for r in rows) else []
    return pd.DataFrame(rows, columns=COLUMNS + extra)


def ran(results: dict[str, ProbeResult]) -> dict[str, ProbeResult]:
    return {v: r for v, r in results.items() if r.ok}


def status_lines(results: dict[str, ProbeResult]) -> str:
    """Where the answers come from, then per release how it ran, or why it did not."""
    labels = sorted({r.recorded for r in results.values() if r.recorded})
    now = [v for v, r in results.items() if not r.recorded]
    live = "SGLAB_REAL=live runs the installed releases here instead"
    parts = [f"answers {'; '.join(labels)} ({live})"] if labels else []
    parts += [f"run here now: {', '.join(now)}"] if now else []
    lines = [
        r.summary(with_source=False)
        if r.ok else f"sglang {v}: not run: {r.reason.removeprefix(f'sglang {v}: ')}"
        for v, r in results.items()
    ]
    return "\n".join(["real SGLang: " + (" · ".join(parts) or "no release asked"), *lines])


def check_table(df, *, what: str = "rows") -> bool:
    """Print a loud banner with every row that disagrees; True when a non-empty table agrees."""
    if df is None or len(df) == 0:
        print(f"no real release ran, so nothing was compared ({what})")
        return False
    bad = df[~df["agrees"].astype(bool)]
    if len(bad):
        lines = [f"{MISMATCH}: {len(bad)} of {len(df)} {what}", bad[COLUMNS].to_string(index=False)]
        lines += [f"  {r.release}: {d}" for r in bad.itertuples() for d in (r.differences or [])
                  ] if "differences" in bad.columns else []
        print("\n".join(lines))
        return False
    print(f"real SGLang and the rebuild agree on all {len(df)} {what}")
    return True


def answers(fix, releases: Optional[Iterable[str]] = None) -> dict[str, ProbeResult]:
    """Each release's answer to the fix's probe (:func:`~sglab.sglang.runner.run_probes`)."""
    p = fix.probe
    return run_probes(list(releases or p.releases), p.fn, p.resolved_params(), jobs=2)


def section(fix, comparison: Callable[[dict], object], *, what: str = "rows",
            results: Optional[dict] = None) -> None:
    """A notebook's real-SGLang section: the answers, the table and the agreement line."""
    import pandas as pd

    from sglab.core.notebook import show_table

    results = answers(fix) if results is None else results
    print(status_lines(results))
    df = comparison(results)
    with pd.option_context("display.max_colwidth", None):  # every cell whole: rows differ late
        show_table(shown(df))
    check_table(df, what=what)


def shown(df):
    """The comparison as a reader sees it: by release, a missing answer "—", agrees yes or NO."""
    out = df[COLUMNS].copy()
    for c in ("real", "expected"):
        out[c] = out[c].map(lambda v: "—" if v is None or (isinstance(v, float) and v != v) else v)
    out["agrees"] = out["agrees"].map(lambda a: "yes" if a else "NO")
    return out.set_index("release")


_TIMELINE_DRAWN: set = set()  # fixes whose timeline row this process has shown


def released(fix, rebuilt=None, *, symbol: Optional[str] = None, pr: Optional[int] = None) -> None:
    """The fix's row of the release timeline (drawn once), then its hunk (:func:`hunks.show`)."""
    from sglab.core.notebook import show_figure, show_table
    from sglab.sglang import hunks, wheels

    if fix.name not in _TIMELINE_DRAWN:  # a notebook shows several hunks of one fix
        _TIMELINE_DRAWN.add(fix.name)
        show_figure(wheels.timeline_row_figure(fix))
    show_table(hunks.show(fix, rebuilt, pr=pr, symbol=symbol))
