"""01 at the PR's own width and metrics: Kimi-K2.5's real widths under the release's server and
``bench_serving`` (TTFT, TPOT, E2E), piecewise graphs enforced against off, beside #26382's figures;
and the checks of the full-width claims (TTFT; prefill and decode under ``bench_one_batch``)."""

from __future__ import annotations

import pandas as pd

from sglab.core import engine_records, engine_stats, notebook, runs, text
from sglab.core.claims import holds, not_applicable
from sglab.pcg_gate import sglang, tables


MODEL = "kimi_k25_full"
METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "E2E"))  # (recorded, shown)
ON, OFF, AGAIN = "enforce", "pcg-off", "pcg-off-again"
FIXED = "0.5.13"
FULL_CAP = 2048  # the largest piecewise capture 0.5.13 resolves for Kimi-K2.5 (pcg_tokens)


def _newest_gpu(rs, models) -> tuple[str, pd.DataFrame]:
    """The newest GPU model whose runs started one of ``models``, and those runs' frame."""
    runs_ = [
        r for r in ([*rs.shown, *rs.elsewhere] if rs else []) if any(
            (e.get("model") or {}).get("name") in models for e in r.manifest.engine_runs)
    ]
    if not runs_:
        return "", pd.DataFrame()
    gpu = max(runs_, key=lambda r: r.manifest.created_utc).manifest.gpu
    return gpu, engine_records.frame([r for r in runs_ if r.manifest.gpu == gpu])


def frame(rs) -> pd.DataFrame:
    """The bench_serving rows of the newest GPU model that recorded them (any GPU model's runs)."""
    gpu, df = _newest_gpu(rs, {MODEL})
    return df[(df.model == MODEL) & (df.tool == "serve")].assign(gpu=gpu) if gpu else df


def numbers(df: pd.DataFrame) -> pd.DataFrame:
    """Per (metric, release, case, prompt tokens, in flight): the starts' median, lo and hi."""
    return engine_stats.memo(df, ("serving",), lambda: _numbers(df))


def _numbers(df: pd.DataFrame) -> pd.DataFrame:
    if df.empty:
        return pd.DataFrame()
    d = pd.concat(
        engine_stats.numbers(df, m, only_started=True).assign(metric=name) for m, name in METRICS)
    d = d.astype({"input_len": int, "requests": int})
    return d.set_index(["metric", "release", "case", "input_len",
                        "requests"])[["value", "lo", "hi"]]


def ratios(df: pd.DataFrame, case: str = ON, base: str = OFF) -> pd.Series:
    """``case`` ÷ ``base`` on 0.5.13 per metric, prompt tokens and in flight (starts' medians)."""
    n = numbers(df)
    fixed = n.xs(FIXED, level="release")["value"].unstack("case") if not n.empty else n
    if not {case, base} <= set(fixed.columns):
        return pd.Series(dtype=float)
    return (fixed[case] / fixed[base]).dropna()


def aa_gaps(df: pd.DataFrame) -> pd.Series:
    """The A/A control's gap, |off ÷ off started again − 1|."""
    return (ratios(df, OFF, AGAIN) - 1).abs()


# -- the full-width claims' checks (claims.ENGINE: full_width_ttft and its folded checks) -----
def _serving(run):
    """The run's full-width serving frame (empty for any other run); shared: never change it."""
    return run.memo("full-width serving", lambda: frame(runs.RunSet([run], [])), shared=True)


def served(run):
    return None if not _serving(run).empty else "no full-width bench_serving run"


def ttft(run):
    """Enforced ÷ off TTFT: above 1 + the A/A gap at the largest capture, below at the shortest."""
    df = _serving(run)
    r, gap = ratios(df), aa_gaps(df)
    if r.empty or gap.empty:
        return not_applicable("no enforced, off and off-again TTFT in this run")
    r, gap = r.xs("TTFT"), gap.xs("TTFT")
    short, long_ = r.index.get_level_values(0).min(), FULL_CAP
    bad = [
        f"{n}×{c}" for (n, c), x in r.items()
        if (n == short and x >= 1 + gap[n, c]) or (n == long_ and x <= 1 + gap[n, c])
    ]
    said = "; ".join(f"{n} tokens × {c}: {x:.2f}× (A/A {gap[n, c]:.1%})" for (n, c), x in r.items())
    value = {f"{n}x{c}": float(x) for (n, c), x in r.items()}
    starts = engine_stats.starts_in(df, "ttft")
    return holds(not bad, f"TTFT enforced ÷ off (median of {starts} interleaved starts): {said}",
                 {**value, "aa_noise": float(gap.max()), "starts": starts},
                 why_not=f"not beyond the A/A gap the expected way at {', '.join(bad)}")


def _full_bench(run):
    """The run's full-width bench_one_batch rows; shared: never change them."""
    df = engine_records.frame([run])  # one per run

    def wide():
        return df[df["model"].isin(tables.FULL_WIDTH) & (df["tool"] == "bench")]

    return run.memo("full-width bench", wide, shared=True)


def benched(run):
    return None if not _full_bench(run).empty else "no full-width bench_one_batch run"


def full_prefill(run):
    """Per full-width model, pcg-off ÷ enforced prefill beyond the A/A gap at both ends."""
    df = _full_bench(run)
    gains = tables.full_width_gains(df)
    gaps = engine_stats.aa_gap_at(df, "prefill", "input_len", tables.STAT)
    value, bad, said = {}, [], []
    for model, g in gains.groupby("model"):
        gap, x = gaps.get((model, FIXED), {}), dict(zip(g.tokens, g.gain))
        short, cap = gap.get(min(x), 0.0), gap.get(FULL_CAP, 0.0)
        if x[min(x)] <= 1 + short or x.get(FULL_CAP, 0) >= 1 - cap:
            bad.append(model)
        noise = max(gap.values(), default=0.0)
        value[model] = {**{f"{n} tokens": float(v) for n, v in x.items()}, "aa_noise": noise}
        said.append(f"{model}: " + ", ".join(f"{n} {v:.2f}×" for n, v in x.items()) +
                    f" (A/A {short:.1%} at {min(x)}, {cap:.1%} at {FULL_CAP})")
    return holds(not bad and bool(value), f"prefill pcg-off ÷ enforced per tokens: "
                 f"{'; '.join(said)}", {**value, "starts": engine_stats.starts_in(df, "prefill")})


DECODE_SAME = 0.02  # decode within 2% (or twice the A/A gap): no change piecewise graphs could make


def full_decode(run):
    """TPOT with one request in flight and the decode step, enforced ÷ off, within their bounds."""
    checks, value, said = [], {}, []  # (name, enforced ÷ off, its A/A gap)
    df = _serving(run)
    if not ratios(df).empty:
        r, gap = ratios(df).xs("TPOT"), aa_gaps(df).xs("TPOT")
        checks.append(("tpot", r.xs(1, level="requests"), gap.xs(1, level="requests").max()))
        value["tpot"] = {f"{n}x{c}": float(x) for (n, c), x in r.items()}
        value["tpot"]["aa_noise"] = float(gap.max())
        value["busy_moved"] = float((r[r.index.get_level_values("requests") > 1] - 1).abs().max())
        said.append("TPOT " + ", ".join(f"{n}×{c} {x:.2f}×" for (n, c), x in r.items()))
    if benched(run) is None:
        d = engine_stats.numbers(_full_bench(run), "decode")
        d = d[d.release == FIXED].pivot_table(index=["model", "input_len"], columns="case",
                                              values="value")
        if not {ON, OFF} <= set(d.columns):
            return not_applicable("no enforced and off decode timing at full width")
        x, again = d[ON] / d[OFF], (d[OFF] / d.get(AGAIN, d[OFF]) - 1).abs().fillna(0.0)
        checks.append(("decode", x, again.max()))
        for m, g in x.groupby(level="model"):
            value[m] = {str(int(n)): float(v) for (_, n), v in g.items()}
            value[m]["aa_noise"] = float(again.xs(m).max())
        said.append("decode step " + ", ".join(f"{m} {int(n)} {v:.3f}×" for (m, n), v in x.items()))
    if not checks:
        return not_applicable("no enforced and off decode timing at full width")
    for name, x, gap in checks:
        value[f"{name}_worst"] = float((x - 1).abs().max())
        value[f"{name}_bound"] = 2 * max(DECODE_SAME / 2, float(gap))
    bad = [name for name, _, _ in checks if value[f"{name}_worst"] > value[f"{name}_bound"]]
    bound = max(value[f"{name}_bound"] for name, _, _ in checks)
    return holds(
        not bad, f"enforced ÷ off: {'; '.join(said)} (" + ", ".join(
            f"{name} worst {value[f'{name}_worst']:.1%}, bound {value[f'{name}_bound']:.1%}"
            for name, _, _ in checks) + ")", {**value, "aa_noise": bound / 2},
        why_not=f"beyond its bound (±{DECODE_SAME:.0%} or twice its A/A gap, whichever is "
        f"larger): {', '.join(bad)}")


# absorbed MLA, which a captured piece runs, takes (512 + 64) + 512 dims per head and query-key
# pair against MHA's (128 + 64) + 128, which eager prefill runs: 3.4× the attention arithmetic
ABSORBED = 2.0  # at least this much attention time, captured ÷ eager
SAME = 0.1  # kernel time that does not change: within ±10%


def kernel_timed(run):
    return None if not tables.kernel_times(_full_bench(run)).empty else (
        "no full-width kernel time per prefill step (recorded by launch passes from 2026-12-06)")


def full_attention(run):
    """Why the captured step loses at long prompts: its attention kernels, the MoE ones alike."""
    t = tables.kernel_times(_full_bench(run))
    ratio = {
        (m, n): (a, moe)
        for (m, n), a, moe in zip(t.index, t["attention, enforced ÷ off"], t["MoE, enforced ÷ off"])
        if n >= 512
    }
    bad = [
        f"{m} {n}" for (m, n), (a, moe) in ratio.items()
        if abs(moe - 1) > SAME or (a <= ABSORBED if n <= FULL_CAP else abs(a - 1) > SAME)
    ]
    said = "; ".join(
        f"{m} {n}: attention {a:.2f}×, MoE {moe:.2f}×" for (m, n), (a, moe) in ratio.items())
    value = {f"{m} {n}": float(a) for (m, n), (a, _) in ratio.items()}
    return holds(not bad and bool(ratio), f"kernel time enforced ÷ off per prefill step: {said}",
                 value,
                 why_not=f"not as absorbed MLA inside the graphs would make it at {', '.join(bad)}")


def table(df: pd.DataFrame) -> pd.DataFrame:
    """Per prompt length and in flight, each metric off and enforced, their ratio, the A/A gap."""
    n = numbers(df)
    if n.empty:
        return pd.DataFrame()
    n = n.reset_index().set_index(["input_len", "requests"])
    n["cell"] = n["value"].map("{:.1f}".format) + [
        f" [{lo:.1f}–{hi:.1f}]" if hi > lo else "" for lo, hi in zip(n["lo"], n["hi"])
    ]
    cols = {}
    for metric, name in METRICS:
        m, unit = n[n.metric == name], engine_stats.unit_of(df, metric)
        unit = f" ({unit})" if unit else ""
        for rel, g in m[(m.release != FIXED) & (m.case == ON)].groupby("release"):
            cols[f"{name} {rel} refused{unit}"] = g["cell"]
        fixed = dict(tuple(m[m.release == FIXED].groupby("case")))
        for case, said in ((OFF, "off"), (ON, "enforced")):
            if case in fixed:
                cols[f"{name} {said}{unit}"] = fixed[case]["cell"]
        v = {case: g["value"] for case, g in fixed.items()}
        if ON in v and OFF in v:  # as the PR gives it: after (enforced) ÷ before (off)
            cols[f"{name} enforced ÷ off"] = (v[ON] / v[OFF]).map("{:.2f}×".format)
        if AGAIN in v and OFF in v:
            cols[f"{name} A/A gap"] = (v[OFF] / v[AGAIN] - 1).abs().map(lambda x: text.pct(x, 1))
    out = pd.DataFrame(cols).sort_index().fillna("")
    out.index.names = ["prompt tokens", "in flight"]
    out.columns.name = "median of the engine starts [lowest–highest start]"
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
                row[f"here: enforced ÷ off, {c} in flight"] = ", ".join(
                    f"{n}: {x:.2f}×" for (n, _), x in v.items())
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
    for head, said in (("Enforced ÷ off TTFT in each recorded run (its own interleaved starts, "
                        "A/A gap)", "; ".join(each_run(rs))),
                       ("The scheduler's own log, per engine start (warm-up passes included)",
                        scheduler(df))):
        if said:
            print(f"{head}: {said}")


def each_run(rs) -> list[str]:
    """Per full-width serving run of the shown GPU model, enforced ÷ off TTFT at both ends."""
    gpu, _ = _newest_gpu(rs, {MODEL})
    said = []
    for r in sorted([*rs.shown, *rs.elsewhere], key=lambda r: r.manifest.created_utc):
        df = _serving(r) if r.manifest.gpu == gpu else pd.DataFrame()
        x, gap = ratios(df), aa_gaps(df)
        if x.empty or gap.empty:
            continue
        x, gap = x.xs("TTFT"), gap.xs("TTFT")
        short = x.index.get_level_values(0).min()
        said.append(f"{engine_records.run_label(r)}: " + ", ".join(
            f"{n}×{c} {v:.2f}× ({text.pct(gap[n, c], 1)})"
            for (n, c), v in x.items() if n in (short, FULL_CAP)))
    return said


def scheduler(df: pd.DataFrame) -> str:
    """Per 0.5.13 case, the prefill batches the scheduler logged and the share on a graph."""
    n = {m: engine_stats.numbers(df, f"serve_prefill_{m}") for m in ("batches", "mixed", "graph")}
    if any(d.empty for d in n.values()):
        return ""
    parts = []
    for case, said in ((OFF, "off"), (ON, "enforced")):
        got = {m: d[(d.release == FIXED) & (d.case == case)]["value"] for m, d in n.items()}
        if any(v.empty for v in got.values()):
            return ""
        parts.append(f"{said}: {got['batches'].iloc[0]:.0f} prefill batches, "
                     f"{got['mixed'].iloc[0]:.0f} of several requests, "
                     f"{got['graph'].iloc[0]:.0%} on a piecewise graph")
    return "; ".join(parts)


def _bench_table(rs, make) -> tuple[str, pd.DataFrame]:
    """``make`` over the newest GPU model's full-width bench_one_batch rows, and that GPU."""
    gpu, df = _newest_gpu(rs, tables.FULL_WIDTH)
    t = make(df)
    if t.empty:
        print("not in the full-width bench_one_batch runs recorded yet: on a GPU box, bash "
              "scripts/engine_gpu.sh --scenario 01-kimi-full-bench --scenario 01-kimi-rank-bench")
    return gpu, t


def estimate(rs) -> None:
    """The measured layers scaled to Kimi-K2.5's 61 (:func:`tables.whole_model`), beside the PR."""
    gpu, t = _bench_table(rs, tables.whole_model)
    if t.empty:
        return
    unit, before, after = sglang.PR_BENCHMARK["metrics"]["TTFT"]
    print(f"An estimate from the runs on {gpu}, one prefill step per prompt: #26382 measured TTFT "
          f"{before} → {after} {unit} ({sglang.PR_BENCHMARK['setup']}), "
          f"{(before - after) * 1e3:.0f} ms saved")
    notebook.show_table(t)


def kernels(rs) -> None:
    """The launch pass's kernel time per prefill step at full width, off against enforced."""
    gpu, t = _bench_table(rs, tables.kernel_times)
    if t.empty:
        return
    shown = pd.DataFrame(index=t.index)
    for _, name in tables.KERNEL_TIMES:
        if f"{name}, off (ms)" in t:
            shown[f"{name} (ms), off → enforced"] = [
                f"{a:.2f} → {b:.2f}"
                for a, b in zip(t[f"{name}, off (ms)"], t[f"{name}, enforced (ms)"])
            ]
            shown[f"{name}, enforced ÷ off"] = t[f"{name}, enforced ÷ off"].map("{:.2f}×".format)
    print(f"GPU time of one prefill step's kernels on {gpu} (the launch pass, under the profiler: "
          "kernel durations, not the step's wall time)")
    notebook.show_table(shown)


def before_after(rs) -> None:
    """#26382's own before → after at full width: 0.5.12.post1 enforced against 0.5.13."""
    found = [(r, engine_records.frame([r])) for r in ([*rs.shown, *rs.elsewhere] if rs else [])]
    found = [(r, df[(df.model == MODEL) & (df.tool == "serve")]) for r, df in found]
    found = [(r, df) for r, df in found if (df.release != FIXED).any() and (df.case == ON).any()]
    if not found:
        print("no full-width serving run of 0.5.12.post1 recorded yet: on a GPU box, bash "
              "scripts/engine_gpu.sh --scenario 01-kimi-full-serve --cases enforce")
        return
    run, df = max(found, key=lambda x: x[0].manifest.created_utc)
    status = df[df.metric == "status"].groupby("release")["value"]
    said = "; ".join(f"{rel}: {(s == 'ok').sum()} of {len(s)} starts answered" + "".join(
        f" ({x.split(' (log:')[0]})" for x in sorted(set(s[s != "ok"]))) for rel, s in status)
    print(f"{engine_records.run_label(run)}, enforced on both releases: {said}")
    n = pd.concat(engine_stats.numbers(df, m).assign(metric=name) for m, name in METRICS)
    n = n[n.case == ON].pivot_table(index=["metric", "input_len", "requests"], columns="release",
                                    values="value")
    (before,), after = [c for c in n.columns if c != FIXED], FIXED
    out = pd.DataFrame({
        f"{before} (refused), ms": n[before].round(2), f"{after} (captured), ms": n[after].round(2),
        "after ÷ before": (n[after] / n[before]).map("{:.2f}×".format)
    }).unstack("metric").swaplevel(axis=1)
    out = out[[(m, c) for _, m in METRICS for c in out.columns.levels[1] if (m, c) in out]]
    out.index = pd.MultiIndex.from_tuples([(int(a), int(b)) for a, b in out.index],
                                          names=["prompt tokens", "in flight"])
    notebook.show_table(out)
