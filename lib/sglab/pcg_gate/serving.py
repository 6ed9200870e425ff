"""01 at the PR's own width and metrics: Kimi-K2.5's real widths served by the release's own server
and measured with its own ``bench_serving`` (scenario ``01-kimi-full-serve``): TTFT, TPOT and E2E
per prompt length and concurrency, piecewise graphs enforced against off, beside #26382's figures.
"""

from __future__ import annotations

import pandas as pd

from sglab.core import engine_records, engine_stats, notebook, text
from sglab.pcg_gate import sglang


MODEL = "kimi_k25_full"
METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "E2E"))
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


def _cell(n) -> str:
    return f"{n.value:.1f}" + (f" [{n.lo:.1f}–{n.hi:.1f}]" if n.hi > n.lo else "")


def _numbers(df: pd.DataFrame, metric: str) -> dict:
    """``{(release, case, prompt tokens, in flight): row}`` of ``metric``, variants that started."""
    d = engine_stats.numbers(df, metric, only_started=True) if not df.empty else df
    return {(x.release, x.case, int(x.input_len), int(x.requests)): x for x in d.itertuples()}


def table(df: pd.DataFrame) -> pd.DataFrame:
    """Per prompt length and concurrency, each metric (ms, median over engine starts [lowest–
    highest start]) with piecewise graphs off and enforced on 0.5.13, off ÷ enforced, and the A/A
    control's gap (pcg-off started twice); 0.5.12.post1 enforced (the gate refuses) where run."""
    rows: dict = {}
    for metric, name in METRICS:
        got = _numbers(df, metric)
        for (rel, case, il, c), x in got.items():
            row, off = rows.setdefault((il, c), {}), got.get((FIXED, OFF, il, c))
            if rel == FIXED and case in (ON, OFF):
                row[f"{name} {'enforced' if case == ON else 'off'}"] = _cell(x)
            elif case == ON:
                row[f"{name} {rel} (refused)"] = _cell(x)
            if rel == FIXED and case == ON and off:
                row[f"{name} off ÷ enforced"] = f"{off.value / x.value:.2f}×"
            if rel == FIXED and case == AGAIN and off:
                row[f"{name} A/A gap"] = text.pct(abs(off.value / x.value - 1), 1)
    if not rows:
        return pd.DataFrame()
    out = pd.DataFrame.from_dict(rows, orient="index").sort_index().fillna("")
    out.index.names = ["prompt tokens", "in flight"]
    return out


def ratios(df: pd.DataFrame) -> dict:
    """``{metric: {(prompt tokens, in flight): enforced ÷ off}}`` on 0.5.13, medians of the
    starts."""
    out: dict = {}
    for metric, name in METRICS:
        got = _numbers(df, metric)
        out[name] = {
            (il, c): x.value / got[(FIXED, OFF, il, c)].value
            for (rel, case, il,
                 c), x in got.items() if rel == FIXED and case == ON and (FIXED, OFF, il, c) in got
        }
    return out


def pr_beside(df: pd.DataFrame) -> pd.DataFrame:
    """#26382's own benchmark (after ÷ before) beside enforced ÷ off here, per concurrency."""
    b, got = sglang.PR_BENCHMARK, ratios(df)
    rows = []
    for name, (unit, before, after) in b["metrics"].items():
        row = {
            "metric": f"{name} ({unit})", "#26382 before → after": f"{before:g} → {after:g}",
            "#26382 after ÷ before": f"{after / before:.2f}×"
        }
        for c in sorted({c for _, c in got.get(name, {})}):
            vals = [v for (il, cc), v in got[name].items() if cc == c]
            row[f"here: enforced ÷ off, {c} in flight"] = text.span(vals, unit="×")
        if not got.get(name):
            row["here"] = "not recorded yet"
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
