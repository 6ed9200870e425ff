"""01 at the PR's own width and metrics: Kimi-K2.5's real widths served by the release's own server
and measured with its own ``bench_serving`` (scenario ``01-kimi-full-serve``): TTFT, TPOT and E2E
per prompt length and concurrency, piecewise graphs enforced against off, beside #26382's figures.
"""

from __future__ import annotations

import pandas as pd

from sglab.core import engine_records, engine_stats, notebook, text
from sglab.pcg_gate import sglang


MODEL = "kimi_k25_full"
METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "E2E"))  # (recorded, shown)
ON, OFF, AGAIN = "enforce", "pcg-off", "pcg-off-again"
FIXED = "0.5.13"


def frame(rs) -> pd.DataFrame:
    """The serving rows of the newest GPU model that recorded them (of every GPU model's runs)."""
    runs_ = [
        r for r in ([*rs.shown, *rs.elsewhere] if rs else []) if any(
            (e.get("model") or {}).get("name") == MODEL for e in r.manifest.engine_runs)
    ]
    if not runs_:
        return pd.DataFrame()
    gpu = max(runs_, key=lambda r: r.manifest.created_utc).manifest.gpu
    df = engine_records.frame([r for r in runs_ if r.manifest.gpu == gpu])
    return df[df.model == MODEL].assign(gpu=gpu)


def numbers(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (metric, release, case, prompt tokens, in flight) of the variants that started:
    the median over engine starts (``value``), the lowest and highest start (``lo``, ``hi``)."""
    parts = [
        engine_stats.numbers(df, m, only_started=True).assign(metric=name) for m, name in METRICS
    ] if not df.empty else []
    if not parts:
        return pd.DataFrame()
    d = pd.concat(parts).astype({"input_len": int, "requests": int})
    return d.set_index(["metric", "release", "case", "input_len",
                        "requests"])[["value", "lo", "hi"]]


def ratios(df: pd.DataFrame) -> pd.Series:
    """Enforced ÷ off on 0.5.13 (medians of the starts) per metric, prompt tokens and in flight."""
    n = numbers(df)
    fixed = n.xs(FIXED, level="release")["value"].unstack("case") if not n.empty else n
    if not {ON, OFF} <= set(fixed.columns):
        return pd.Series(dtype=float)
    return (fixed[ON] / fixed[OFF]).dropna()


def table(df: pd.DataFrame) -> pd.DataFrame:
    """Per prompt length and concurrency, each metric (ms, median over engine starts [lowest–
    highest start]) with piecewise graphs off and enforced on 0.5.13, off ÷ enforced, and the A/A
    control's gap (pcg-off started twice); 0.5.12.post1 enforced (the gate refuses) where run."""
    n = numbers(df)
    if n.empty:
        return pd.DataFrame()
    n = n.reset_index().set_index(["input_len", "requests"])
    n["cell"] = n["value"].map("{:.1f}".format) + [
        f" [{lo:.1f}–{hi:.1f}]" if hi > lo else "" for lo, hi in zip(n["lo"], n["hi"])
    ]
    cols = {}
    for _, name in METRICS:
        m = n[n.metric == name]
        for rel, g in m[(m.release != FIXED) & (m.case == ON)].groupby("release"):
            cols[f"{name} {rel} (refused)"] = g["cell"]
        fixed = dict(tuple(m[m.release == FIXED].groupby("case")))
        for case, said in ((OFF, "off"), (ON, "enforced")):
            if case in fixed:
                cols[f"{name} {said}"] = fixed[case]["cell"]
        v = {case: g["value"] for case, g in fixed.items()}
        if ON in v and OFF in v:
            cols[f"{name} off ÷ enforced"] = (v[OFF] / v[ON]).map("{:.2f}×".format)
        if AGAIN in v and OFF in v:
            cols[f"{name} A/A gap"] = (v[OFF] / v[AGAIN] - 1).abs().map(lambda x: text.pct(x, 1))
    out = pd.DataFrame(cols).sort_index().fillna("")
    out.index.names = ["prompt tokens", "in flight"]
    return out


def pr_beside(df: pd.DataFrame) -> pd.DataFrame:
    """#26382's own benchmark (after ÷ before) beside enforced ÷ off here, per concurrency."""
    r = ratios(df)
    rows = []
    for metric, (unit, before, after) in sglang.PR_BENCHMARK["metrics"].items():
        row = {
            "metric": f"{metric} ({unit})", "#26382 before → after": f"{before:g} → {after:g}",
            "#26382 after ÷ before": f"{after / before:.2f}×"
        }
        if r.empty or metric not in r.index.get_level_values(0):
            row["here"] = "not recorded yet"
        else:
            for c, v in r.xs(metric).groupby(level="requests"):
                row[f"here: enforced ÷ off, {c} in flight"] = text.span(v, unit="×")
        rows.append(row)
    return pd.DataFrame(rows).set_index("metric")


def show(rs) -> None:
    """The PR's benchmark beside what was measured here, then the whole serving table."""
    df = frame(rs)
    b = sglang.PR_BENCHMARK
    print(f"#26382's own benchmark: {b['setup']}; here: Kimi-K2.5's text widths with dummy weights "
          "(data/models/kimi_k25_full), the release's server and bench_serving on one GPU" +
          (f" ({df.gpu.iloc[0]})" if not df.empty else ""))
    notebook.show_table(pr_beside(df))
    t = table(df)
    if t.empty:
        print("no full-width serving run recorded yet: on a GPU box, bash scripts/engine_gpu.sh "
              "--scenario 01-kimi-full-serve")
        return
    notebook.show_table(t)
