"""Statistics over an engine frame (:func:`sglab.core.engine_records.frame`): engine starts folded
into a median and a range, speed-ups, the A/A control's gap, the bar a timing claim must clear."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pandas as pd

from sglab.core import text
from sglab.core.engine_records import AGAIN, KEYS, cached, frame, run_label, run_host_us

# What a timing ratio reads of a variant's engine starts: ``{stat: (metric suffix, column)}``
STATS = {"median": ("", "value"), "fastest": ("", "lo"), "floor": ("_min", "lo")}
STAT_NAMES = dict(median="median of starts", fastest="fastest start",
                  floor="fastest repeat of any start")
# The statistic every engine timing claim reads: a vCPU's per-launch cost only ever adds time
STAT = "floor"

_MEMO: OrderedDict = OrderedDict()


def memo(df: pd.DataFrame, key: tuple, work):
    """``work()`` once per frame object (never changed in place) and ``key``, a copy each call."""
    return cached(_MEMO, (df,), key, work, 512).copy()


def unit_of(df: pd.DataFrame, metric: str) -> str:
    u = df.loc[df.metric == metric, "unit"].dropna()
    return str(u.iloc[0]) if len(u) else ""


def texts(df: pd.DataFrame, metric: str) -> dict:
    """``{(model, release, case): value}`` of a text metric (of several starts, a status not ok)."""
    return memo(df, ("texts", metric), lambda: _texts(df, metric))


def _texts(df: pd.DataFrame, metric: str) -> dict:
    d = df.iloc[_positions(df).get(metric, np.zeros(0, int))]
    if metric == "status":
        d = d.assign(_ok=d["value"] == "ok").sort_values("_ok", ascending=False, kind="stable")
    return dict(zip(zip(*(d[c].to_numpy(object) for c in KEYS)), d["value"]))


def started(df: pd.DataFrame, model: str | None = None) -> dict:
    """``{(model, release, case): True/False}``: whether each variant started and answered."""
    return {k: v == "ok" for k, v in texts(df, "status").items() if model in (None, k[0])}


def numbers(df: pd.DataFrame, metric: str, *, only_started: bool = False) -> pd.DataFrame:
    """The rows of ``metric``, each variant and shape's engine starts folded into one row."""
    return memo(df, ("numbers", metric, only_started), lambda: _numbers(df, metric, only_started))


def _numbers(df: pd.DataFrame, metric: str, only_started: bool) -> pd.DataFrame:
    at = _positions(df).get(metric, np.zeros(0, int))
    d = df.iloc[at].assign(value=lambda d: pd.to_numeric(d["value"], errors="coerce"))
    if only_started and not d.empty:
        kept = cached(_MEMO, (df,), ("started rows",), lambda: _started_rows(df), 512)[at]
        d, at = d[kept], at[kept]
    if d.empty or "start" not in d or d["start"].nunique(dropna=True) < 2:
        return d.assign(lo=d["value"], hi=d["value"], starts=1)
    keys = [c for c in d.columns if c not in ("start", "value")]
    # numbered in the frame's order of appearance: so are these groups
    _, first, of = np.unique(_groups(df)[at], return_index=True, return_inverse=True)
    # median, min, max and count per group as pandas gives them: each group's values sorted
    # together (NaN last: a group of NaN alone reads NaN), min and max of the value's own dtype
    v = d["value"].to_numpy()
    s, size = v[np.lexsort((v, of))], np.bincount(of, minlength=len(first))
    n, at0 = np.bincount(of, pd.notna(v), len(first)).astype(int), np.cumsum(size) - size
    top = at0 + np.maximum(n - 1, 0)
    out = dict(value=(s[at0 + n // 2] + s[(at0 + top) // 2]) / 2, lo=s[at0], hi=s[top], starts=n)
    return d.iloc[first][keys].reset_index(drop=True).assign(**out)


def _started_rows(df: pd.DataFrame) -> np.ndarray:
    ok, rows = started(df), zip(*(df[c].to_numpy(object) for c in KEYS))  # fast to walk
    return np.array([ok.get(k, False) for k in rows], bool)


def _positions(df: pd.DataFrame) -> dict:
    """``{metric: its rows' positions}``; once per frame."""
    return cached(_MEMO, (df,), ("at",), lambda: df.groupby("metric", sort=False).indices, 512)


def _groups(df: pd.DataFrame) -> np.ndarray:
    """Each row's group (the rows that differ in start and value alone), in order of appearance."""
    keys = [c for c in df.columns if c not in ("start", "value")]
    return cached(_MEMO, (df,), ("groups",),
                  lambda: df.groupby(keys, dropna=False, sort=False).ngroup().to_numpy(), 512)


def reading(df: pd.DataFrame, metric: str, stat: str = "median") -> pd.DataFrame:
    """:func:`numbers` of ``metric`` (variants that started), ``value`` the statistic ``stat``."""
    suffix, col = STATS[stat]
    d = numbers(df, metric + suffix, only_started=True)
    return d.assign(value=d[col]) if col != "value" and not d.empty else d


def starts_in(df: pd.DataFrame, metric: str) -> int:
    """The most engine starts behind any one value of ``metric``."""
    return int(numbers(df, metric)["starts"].max())


def ratios(df: pd.DataFrame, metric: str, across: str, base: str, stat: str = "median") -> dict:
    """``{(model, release, case): {x: (base ÷ case, widest its starts allow)}}`` of ``across``."""
    d = reading(df, metric, stat)
    groups = d.groupby(KEYS)
    per = {tuple(k): dict(zip(map(int, g[across]), zip(g.value, g.lo, g.hi))) for k, g in groups}
    out = {}
    for (model, rel, case), times in per.items():
        ref = per.get((model, rel, base))
        if case != base and ref:
            out[(model, rel, case)] = {
                n: (ref[n][0] / t[0], ref[n][1] / t[2], ref[n][2] / t[1])
                for n, t in times.items() if n in ref
            }
    return out


def aa_gap(df: pd.DataFrame, metric: str, across: str, stat: str = "median") -> dict:
    """Per (model, release), the largest gap on ``metric`` between a case and its A/A copy."""
    return {k: max(g.values()) for k, g in aa_gap_at(df, metric, across, stat).items()}


def aa_gap_at(df: pd.DataFrame, metric: str, across: str, stat: str = "median") -> dict:
    """Per (model, release), ``{value of across: |case ÷ its A/A copy − 1|}`` on ``metric``."""
    d = reading(df, metric, stat)
    if d.empty:
        return {}
    per = {tuple(k): dict(zip(g[across].astype(int), g["value"])) for k, g in d.groupby(KEYS)}
    out = {}
    for (model, rel, case), again in per.items():
        base = per.get((model, rel, case.removesuffix(AGAIN)))
        if case.endswith(AGAIN) and base:
            gaps = {n: abs(base[n] / v - 1) for n, v in again.items() if n in base and v}
            if gaps:
                out[(model, rel)] = gaps
    return out


def starts_how(starts: int, stat: str = "median") -> str:
    """What one timing is, by the number of engine starts behind it and the statistic read."""
    if starts < 2:
        return f"one engine start, {'fastest' if stat == 'floor' else 'median'} of its repeats"
    how = {"median": "median", "fastest": "fastest", "floor": "fastest repeat"}[stat]
    return f"{how} of {starts} interleaved engine starts"


def timing_source(starts: int, host: float | None, stat: str = "median") -> str:
    """Where a ratio of engine timings comes from: which of how many starts, and the host's cost."""
    return starts_how(starts, stat) + (f", host {host:.1f} µs per launch" if host else "")


def bar(df: pd.DataFrame, metric: str, across: str, stat: str = "median") -> tuple[float, int, str]:
    """What a timing claim on ``metric`` must clear: ``(A/A gap, starts, how)``."""
    noise = max(aa_gap(df, metric, across, stat).values(), default=0.0)
    starts = starts_in(df, metric)
    how = (f"{starts_how(starts, stat)}; A/A control within {noise:.1%}, so the bar is "
           f"{1 + noise:.2f}×" if starts > 1 else f"{starts_how(starts, stat)}; no A/A control")
    return noise, starts, how


# -- the methods notebook's tables: every machine, every start ---------------------------------
def aa_gaps(rs, metric: str, across: str):
    """``(run, (model, release), {stat: aa_gap})`` of every A/A control of every run."""
    for r in rs.every():
        gaps = {s: aa_gap(frame([r]), metric, across, s) for s in STATS}
        yield from ((r, key, gaps) for key in gaps[STAT])


def aa_table(rs, metric: str, across: str) -> pd.DataFrame:
    """Per run (every GPU model) and (model, release): the A/A gap read by each statistic."""
    rows = {(run_label(r), " ".join(key)): {
                f"A/A gap, {STAT_NAMES[s]}": f"{g[key]:.1%}" if key in g else ""
                for s, g in gaps.items()
            }
            for r, key, gaps in aa_gaps(rs, metric, across)}
    out = pd.DataFrame.from_dict(rows, orient="index")
    if not out.empty:
        out.index.names = ["run", "model and release"]
    return out


def starts_and_host(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Each engine start's median ``metric`` beside what the host did (:mod:`.hoststate`)."""
    host = df[df.metric.isin(["host_steal", "host_busy", "engine_preempted"])]
    times = df[df.metric == metric]
    if host.empty or times.empty or "start" not in df:
        return pd.DataFrame()
    idx = [*KEYS, "start"]
    t = times.assign(value=pd.to_numeric(times["value"], errors="coerce")).groupby(idx)["value"]
    out = t.median().rename(f"{metric} ({unit_of(df, metric)}), median over shapes").to_frame()
    wide = host.assign(value=pd.to_numeric(host["value"], errors="coerce")).pivot_table(
        index=idx, columns="metric", values="value", aggfunc="first")
    named = dict(host_steal="CPU stolen (%)", host_busy="CPUs busy (%)",
                 engine_preempted="engine preempted (switches)")
    out = out.join(wide, how="inner").rename(columns=named)
    out.index = out.index.set_levels(out.index.levels[-1].astype(int), level=-1)
    return text.counts(out.round(2), ["engine preempted (switches)"])


def reruns(rs, ratio_of, stats: tuple = (STAT, "fastest", "median")) -> pd.DataFrame:
    """A timed pair recorded by several runs: per (pair, run) its ratios, host cost and drift."""
    cells: dict = {}
    for r in rs.every():
        for s in stats:
            for pair, per in ratio_of(frame([r]), s).items():
                if per:
                    cell = cells.setdefault(pair, {}).setdefault(
                        run_label(r), {"host": run_host_us(r), "gpu": r.manifest.gpu})
                    cell[s] = (min(per.values()), text.span(per.values(), unit="×"))
    rows = {}
    for pair, by_run in cells.items():
        if len(by_run) < 2:
            continue
        # per GPU model, its oldest run's lowest ratio
        first = {c["gpu"]: c[stats[0]][0] for c in reversed(by_run.values()) if stats[0] in c}
        for at, c in by_run.items():
            ratios = {STAT_NAMES[s]: c[s][1] if s in c else "" for s in stats}
            rows[(pair, at)] = {
                **ratios, "host µs per launch": "" if c["host"] is None else f"{c['host']:.1f}",
                "drift": text.signed(c[stats[0]][0] / first[c['gpu']] - 1) if stats[0] in c else ""
            }
    out = pd.DataFrame.from_dict(rows, orient="index")
    if not out.empty:
        out.index.names = ["pair", "run"]
        out.columns.name = "ratio, lowest–highest over the x values"
    return out
