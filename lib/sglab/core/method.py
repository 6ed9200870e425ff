"""The methods notebook's (07) tables over every fix's recorded engine runs: how one timing is made,
the A/A control, the host, reruns, exact counts, verdicts and tolerances."""

from __future__ import annotations

import html
import math
import statistics

import pandas as pd

from sglab.core import claims as C
from sglab.core import text
from sglab.core.engine_records import KEYS, frame, per_gpu, run_label
from sglab.core.engine_records import by_gpu as runs_by_gpu
from sglab.core.engine_stats import (AGAIN, STAT, STAT_NAMES, STATS, aa_gaps, numbers,
                                     starts_and_host, unit_of)
from sglab.core.notebook import MODES, display, in_notebook, mode_line, show_table


TIME_UNITS = ("ms", "s", "µs")
COUNT_UNITS = ("kernels", "launches", "replays", "objects")  # counted, so exact on every run


def timed(view, df: pd.DataFrame) -> list[tuple[str, str]]:
    """``(metric, across)`` of a view's pairs, then of its tables whose unit is a time."""
    found = [(p.metric, p.across) for p in getattr(view, "pairs", ())]
    found += [(t.metric, t.across)
              for t in getattr(view, "tables", ()) if unit_of(df, t.metric) in TIME_UNITS]
    return list(dict.fromkeys(found))


def counted(df: pd.DataFrame) -> list[str]:
    """The metrics of a frame that count something (:data:`COUNT_UNITS`), in name order."""
    return sorted(
        m for m, u in df.groupby("metric")["unit"].first().dropna().items() if u in COUNT_UNITS)


# -- one timing ------------------------------------------------------------------------------------
def launch_order(run) -> pd.DataFrame:
    """The run's timed engine starts in launch order: per (model, release, round), its cases."""
    rows: dict = {}
    for s in run.manifest.params.get("specs", []):
        if s.get("profile"):
            continue
        key = (s.get("model", "?"), s.get("release"), int(s.get("start") or 0) + 1)
        rows.setdefault(key, []).append(s.get("case"))
    out = pd.DataFrame([{
        "model": m, "release": r, "round": n, "cases, in launch order": " → ".join(c)
    } for (m, r, n), c in rows.items()])
    return out.set_index(["model", "release", "round"]) if rows else out


def _with_control(run, base: str, metric: str) -> tuple | None:
    """The first (model, release) of a run that timed ``metric`` in ``base`` and its A/A copy."""
    df = frame([run]).loc[lambda d: d.metric == metric]
    got = {tuple(k) for k in df[KEYS].drop_duplicates().itertuples(index=False)}
    return next(((m, r) for m, r, c in sorted(got) if c == base + AGAIN and (m, r, base) in got),
                None)


def example_run(rs, base: str, metric: str):
    """The newest shown run that timed ``metric`` in ``base`` and its A/A copy (None: none)."""
    return next((r for r in sorted(rs.shown, key=lambda r: r.manifest.created_utc, reverse=True)
                 if _with_control(r, base, metric)), None)


def one_timing(run, metric: str, across: str, base: str, cases=(), x=None) -> pd.DataFrame:
    """How one timing of ``run`` is made at ``across`` nearest ``x``, per case and start."""
    model, rel = _with_control(run, base, metric)
    df = frame([run])
    df = df[(df.model == model) & (df.release == rel)]
    xs = pd.to_numeric(df[across], errors="coerce")
    x = int(min(xs.dropna().unique(), key=lambda v: (abs(v - (x or 0)), v)))
    d = df[xs == x]
    rest = sorted(c for c in set(d.case) if c != base and not c.endswith(AGAIN))
    want = [base, base + AGAIN, *(c for c in rest if not cases or c in cases)]
    rows = []
    for case in want:
        one = d[d.case == case]
        got = (one[one.metric == m].set_index("start")["value"] for m in (metric, metric + "_min"))
        med, low = (pd.to_numeric(s).groupby(level=0).median() for s in got)
        if med.empty:
            continue
        row = {"case": case, **{f"start {int(s) + 1}": v for s, v in med.sort_index().items()}}
        row[STAT_NAMES["median"]] = med.median()
        row[STAT_NAMES["fastest"]] = med.min()
        row[STAT_NAMES["floor"]] = low.min() if len(low) else float("nan")
        row["spread between starts"] = text.pct(med.max() / med.min() - 1, 1)
        rows.append(row)
    out = pd.DataFrame(rows).set_index("case").round(3)
    out.columns.name = f"{model} {rel}, {metric} ({unit_of(df, metric)}) at {across} {x}"
    return text.blank(out)


# -- the A/A control -------------------------------------------------------------------------------
def aa_controls(rs, metric: str, across: str) -> list[dict]:
    """Every A/A control of every run: its ``gpu`` and its gap by each statistic (``inf``: none)."""
    return [{"gpu": r.manifest.gpu, **{s: g.get(key, math.inf)
                                       for s, g in gaps.items()}}
            for r, key, gaps in aa_gaps(rs, metric, across)]


def aa_summary(controls: list[dict]) -> pd.DataFrame:
    """:func:`aa_controls` per GPU model: how many, and each statistic's gap and times smallest."""
    rows = []
    for gpu in dict.fromkeys(c["gpu"] for c in controls):
        got = [c for c in controls if c["gpu"] == gpu]
        row = {"GPU": gpu, "controls": len(got)}
        for s in STATS:
            v = [g[s] for g in got if g[s] < math.inf]
            best = sum(min(STATS, key=g.get) == s for g in got)
            row[STAT_NAMES[s]] = (f"{statistics.median(v):.1%} ({min(v):.1%}–{max(v):.1%}); "
                                  f"smallest in {best}")
        rows.append(row)
    return pd.DataFrame(rows).set_index("GPU") if rows else pd.DataFrame()


def best_statistic(controls: list[dict]) -> tuple[str, int, int]:
    """``(statistic, k, n)``: the statistic with the smallest A/A gap in the most (k) of n."""
    wins = {s: sum(min(STATS, key=c.get) == s for c in controls) for s in STATS}
    best = max(wins, key=wins.get)
    return best, wins[best], len(controls)


# -- the host --------------------------------------------------------------------------------------
def host_costs(runs_: list) -> pd.DataFrame:
    """Per run, the host's µs per launch measured before and after it, and their ratio."""
    rows = []
    for r in runs_:
        h = r.manifest.host_launch_us
        b, a = ((h.get(k) or {}).get("median") for k in ("before", "after"))
        rows.append({
            "run": run_label(r), "GPU": r.manifest.gpu, "before": b, "after": a,
            "after ÷ before": f"{a / b:.2f}×" if a and b else ""
        })
    return pd.DataFrame(rows).set_index("run") if rows else pd.DataFrame()


def host_by_gpu(runs_: list) -> pd.DataFrame:
    """:func:`host_costs` per GPU model: runs, the costs' span, the widest change in a run."""
    t = host_costs(runs_)
    if t.empty:
        return t
    rows = []
    for gpu, g in t.groupby("GPU", sort=False):
        both = pd.concat([g["before"], g["after"]]).dropna()
        moved = (g["after"] / g["before"]).dropna()
        beside = int(g[["before", "after"]].notna().any(axis=1).sum())
        rows.append({
            "GPU": gpu, "runs": len(g), "measured beside": beside,
            "µs per launch, every run": text.span(both, "{:.1f}"),
            "widest change within one run": text.pct(max(moved.max(), 1 / moved.min()) - 1)
            if len(moved) else ""
        })
    return pd.DataFrame(rows).set_index("GPU")


def slowest_starts(df: pd.DataFrame, metric: str) -> tuple[int, int, int, float]:
    """``(k, n, starts, most stolen %)``: the slowest start is the most preempted in ``k`` of ``n``
    variants (by chance about ``n / starts``), and the most CPU time stolen from any start."""
    t = starts_and_host(df, metric)
    if t.empty:
        return 0, 0, 0, float("nan")
    time_col = t.columns[0]
    k = n = starts = 0
    for _, g in t.groupby(level=[0, 1, 2]):
        if len(g) < 2:
            continue
        n, starts = n + 1, max(starts, len(g))
        k += g[time_col].idxmax() == g["engine preempted (switches)"].astype(float).idxmax()
    return k, n, starts, float(t["CPU stolen (%)"].max())


# -- reruns and counts -----------------------------------------------------------------------------
def pair_ratios(pair):
    """``frame, stat -> {(model, release, case): {x: base ÷ case}}``, for ``reruns``."""
    return lambda df, stat: {
        k: {x: v[0]
            for x, v in per.items()}
        for k, per in pair.ratios(df, stat).items()
    }


def drift_summary(table: pd.DataFrame) -> pd.DataFrame:
    """A reruns table per pair and GPU model: runs, the claims' statistic, drift from the oldest."""
    if table.empty:
        return table
    stat, rows = STAT_NAMES[STAT], []
    pairs, runs_ = (table.index.get_level_values(k) for k in ("pair", "run"))
    for (pair, gpu), g in table.groupby([pairs, runs_.str.split(",").str[0]], sort=False):
        drift = [float(d.rstrip("%")) / 100 for d in g["drift"] if d]
        rows.append({
            "pair": " ".join(pair), "GPU": gpu, "runs": len(g),
            f"ratio ({stat}), each run": "; ".join(c for c in g[stat] if c),
            "drift from its oldest run": text.span(drift, "{:+.0%}")
        })
    return pd.DataFrame(rows).set_index(["pair", "GPU"])


def exact_counts(rs, metric: str) -> pd.DataFrame:
    """Per (model, release, case) of a count: its runs, values, and one value per shape or not."""
    seen: dict = {}
    for r in rs.every():
        d = numbers(frame([r]), metric, only_started=True).dropna(subset=["value"])
        fixed = (*KEYS, "value", "lo", "hi", "starts", "metric", "unit", "run", "tp", "variant",
                 "experiment", "tool", "start")
        shape = [c for c in d.columns if c not in fixed and d[c].notna().any()]
        for row in d.itertuples(index=False):
            key = tuple(getattr(row, k) for k in KEYS)
            at = tuple(getattr(row, c) for c in shape)
            cell = seen.setdefault(key, {"runs": set(), "at": {}})
            cell["runs"].add(run_label(r))
            cell["at"].setdefault(at, set()).update({row.lo, row.hi})
    rows = [{
        "model": m, "release": rel, "case": case, "runs": len(c["runs"]),
        "values": text.count(sorted(set().union(*c["at"].values())), exact=True),
        "one value per shape": "yes" if all(len(v) == 1 for v in c["at"].values()) else "NO"
    } for (m, rel, case), c in sorted(seen.items())]
    return pd.DataFrame(rows).set_index(KEYS) if rows else pd.DataFrame()


# -- verdicts and tolerances -----------------------------------------------------------------------
def ledger(entries) -> pd.DataFrame:
    """A row per ``(fix, run, engine claims)``: GPU, date, TP size and verdict line."""
    rows = [{
        "fix": fix, "run": run_label(r), "GPU": f"{r.manifest.gpu} ×{r.manifest.gpu_count}",
        "date": r.manifest.date, "TP": r.manifest.tp, "verdict": C.verdict(C.evaluated(mod, r))
    } for fix, r, mod in entries]
    return pd.DataFrame(rows).set_index(["fix", "run"]) if rows else pd.DataFrame()


def ledger_summary(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`ledger` per fix and GPU model: runs, TP sizes, days, runs with a failing claim."""
    if table.empty:
        return table
    t = table.reset_index().assign(gpu=lambda d: d["GPU"].str.split(" ×").str[0])
    return t.groupby(["fix", "gpu"], sort=False).agg(
        runs=("run", "size"), TP=("TP", lambda v: ", ".join(map(str, sorted(set(v))))),
        days=("date", lambda v: min(v) if min(v) == max(v) else f"{min(v)} to {max(v)}"),
        failing=("verdict",
                 lambda v: int(v.str.contains("fail").sum()))).rename_axis(["fix", "GPU"])


def tolerances(fix: str, engine_claims, rs) -> pd.DataFrame:
    """Per engine claim of a fix: what it expects, how far a rerun may move, the A/A gap."""
    merged = per_gpu(rs) if rs else []
    rows = []
    for c in engine_claims.CLAIMS:
        got = [(r.manifest.gpu, C.evaluate_claim(c, r).value) for r in merged] if c.noise else []
        got = [(gpu, v.get(c.noise)) for gpu, v in got if isinstance(v, dict)]
        gaps = [f"{gpu} {x:.1%}" for gpu, x in got if x is not None]
        drift = ("exact" if c.drift is None else
                 "not compared" if math.isinf(c.drift) else f"±{c.drift:.0%}")
        rows.append({
            "fix": fix, "claim": c.id.split(".", 1)[-1], "expected": c.expected, "rerun": drift,
            "A/A gap to clear": ", ".join(gaps)
        })
    return pd.DataFrame(rows).set_index(["fix", "claim"])


# -- across machines -------------------------------------------------------------------------------
def by_gpu(rs, fn) -> dict:
    """``{GPU model: fn(frame of its runs)}`` over every recorded run (the shown model first)."""
    return {gpu: fn(frame(got)) for gpu, got in runs_by_gpu([*rs.shown, *rs.elsewhere]).items()}


def side_by_side(tables: dict, index: list[str], value: str) -> pd.DataFrame:
    """``{GPU: table}`` as one table: ``value`` per GPU model (for two, also their ratio)."""
    parts = {g: t.set_index(index)[value] for g, t in tables.items() if not t.empty}
    if not parts:
        return pd.DataFrame()
    out = pd.DataFrame(parts)
    if len(parts) == 2:
        a, b = list(parts)
        out[f"{b} ÷ {a}"] = out[b] / out[a]
    return out


def agreement(tables: dict, index: list[str], title: str):
    """Two GPU models' readings of the same cells as points, the diagonal where they agree."""
    import matplotlib.pyplot as plt

    (a, ta), (b, tb) = list(tables.items())[:2]
    both = ta.merge(tb, on=index, suffixes=(" a", " b"))
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    for key, g in both.groupby(index[0]):
        err = {s: [g[f"gain {s}"] - g[f"lo {s}"], g[f"hi {s}"] - g[f"gain {s}"]] for s in "ab"}
        ax.errorbar(g["gain a"], g["gain b"], xerr=err["a"], yerr=err["b"], fmt="o", capsize=2,
                    elinewidth=0.7, label=f"{index[0]} {key}")
    lo, hi = min(both[["lo a", "lo b"]].min()), max(both[["hi a", "hi b"]].max())
    ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8, ls="--")
    ax.set(xlabel=a, ylabel=b, title=title)
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# -- what the notebook says ------------------------------------------------------------------------
def banner(mode: str, runs_: int, fixes: int, probes: int) -> None:
    """07's mode line: recorded, whatever ``mode``; it measures nothing."""
    if mode not in MODES:
        raise ValueError(f"MODE must be one of {MODES}, got {mode!r}")
    mode_line({"experiment": "how_we_measure", "mode": "recorded", "gpus_needed": 0},
              f"Mode **recorded**: every number below is read from the {runs_} committed engine "
              f"runs of {fixes} fixes and {probes} host probes in `data/recorded/`; nothing is "
              f"measured here (`MODE={mode!r}`).")


def conclude(sentence: str) -> None:
    """What the reader should take from a section, in bold where markdown is shown."""
    display(None, f"So: {sentence}", f"**So:** {sentence}")


def folded(df: pd.DataFrame, what: str, rows: int = 0) -> None:
    """A long table folded under ``what``, its first ``rows`` rows above the fold."""
    if df.empty:
        return
    if len(df) <= rows or not in_notebook():
        show_table(df)
        return
    if rows:
        show_table(df.head(rows))
    display(
        None, df.to_string(), html=f"<details><summary>{html.escape(what)} (all "
        f"{len(df)} rows)</summary>{df.to_html()}</details>")
