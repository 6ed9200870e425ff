"""A pcg_gate run read as tables (latency, launches, the gate, the traced pass, the copies), and the
real engine's runs as 01's pairs, launch counts and width gains: what claims and notebook read."""

from __future__ import annotations

import re
from typing import Optional

import numpy as np
import pandas as pd

from sglab.core import engine_records, engine_stats, kernel_table, runs
from sglab.pcg_gate import rebuild, sglang
from sglab.pcg_gate.measure import DEFAULT_PARAMS, GATE_METRICS, HOST
from sglab.sglang.engine import spec


TIMES = (("time_median", "median"), ("time_p10", "p10"), ("time_p90", "p90"))
CHECKS = ("max_abs_diff", "rel_rms_diff", "max_abs_diff_same_shape", "tolerance", "within_tol")
LAUNCH_BOUND = 128  # token counts up to here: eager prefill is its launches
STAT = engine_stats.STAT  # what the engine's timings read: the fastest repeat of any start


# -- tables of a run -------------------------------------------------------------------------------
def _per_token(df: pd.DataFrame) -> pd.DataFrame:
    d = df.dropna(subset=["num_tokens"]).copy()
    d["num_tokens"] = d["num_tokens"].astype(int)
    return d


def latency_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per timed count: eager and piecewise times (ms), their ratio, the correctness columns."""
    d = _per_token(df)
    times = d[d.metric.isin([m for m, _ in TIMES])]
    wide = times.pivot_table(index="num_tokens", columns=["variant", "metric"], values="value")
    out = pd.DataFrame(index=wide.index)
    for mode in ("eager", "piecewise"):
        for m, lab in TIMES:
            out[f"{mode} {lab} ms"] = wide[(mode, m)]
    out["speedup"] = out["eager median ms"] / out["piecewise median ms"]
    if ("piecewise_direct", "time_median") in wide.columns:
        out["direct median ms"] = wide[("piecewise_direct", "time_median")]
        out["speedup_direct"] = out["eager median ms"] / out["direct median ms"]
    c = d[d.metric.isin(CHECKS) & (d.variant == "piecewise")]
    cw = c.pivot_table(index="num_tokens", columns="metric", values="value").reindex(out.index)
    buckets = d.dropna(subset=["bucket"]).groupby("num_tokens")["bucket"].first()
    out.insert(0, "bucket", buckets.reindex(out.index).astype(int))
    return out.join(cw[list(CHECKS)].astype({"within_tol": bool}))


def latency_of(run) -> pd.DataFrame:
    """:func:`latency_table` of a run, worked out once per run."""
    return run.memo("latency_table", lambda: latency_table(run.df))


def launch_table(df: pd.DataFrame) -> pd.DataFrame:
    """Method 3, per timed token count: launches, the host's cost per launch, ``gain explained``."""
    d = _per_token(df)
    w = d[d.metric.isin(["launches", "device_us", "time_median", "launch_us", "launch_event_us"
                         ])].pivot_table(index="num_tokens", columns=["variant", "metric"],
                                         values="value")
    if (HOST, "launch_us") not in w.columns or ("eager", "launches") not in w.columns:
        return pd.DataFrame()
    te, tp = w[("eager", "time_median")] * 1e3, w[("piecewise", "time_median")] * 1e3
    le, lp, c = w[("eager", "launches")], w[("piecewise", "launches")], w[(HOST, "launch_us")]
    floor = np.maximum(w[("piecewise", "device_us")], lp * te / le)
    return pd.DataFrame({
        "eager launches": le, "piecewise launches": lp, "host µs/launch": c,
        "host µs/launch (CUDA events)": w.get((HOST, "launch_event_us")), "eager ms": te / 1e3,
        "eager µs/launch": te / le, "eager ÷ host cost": te / (le * c), "piecewise ms": tp / 1e3,
        "piecewise device ms": w[("piecewise", "device_us")] / 1e3,
        "gain explained": (te - tp) / (te - floor)
    })


def run_facts(df: pd.DataFrame) -> dict:
    """The run-level numbers (capture time, graphs, pool, ...): ``(variant, metric) -> value``."""
    g = df[df["num_tokens"].isna()]
    return {(r.variant, r.metric): r.value for r in g.itertuples()}


def slowdown_start(speedup: pd.Series) -> Optional[int]:
    """The smallest token count from which every ratio is below 1 (None if the last is not)."""
    below = (~(speedup.sort_index(ascending=False) >= 1.0)).cummin()  # from the largest count down
    return int(below[below].index.min()) if below.any() else None


def buffer_copy_bytes(params: dict, num_tokens: int) -> int:
    """Bytes the copy hand-off adds per prefill: 5 bf16 tensors per layer and the output."""
    p = {**DEFAULT_PARAMS, **params}
    return 2 * int(num_tokens) * int(p["hidden"]) * 2 * (5 * int(p["num_layers"]) + 1)


def gate_table(df: pd.DataFrame) -> pd.DataFrame:
    """Method 2 on: the gate per wrapper variant around the measured LLM (decision, key counts)."""
    g = df[df.variant.isin(rebuild.ALL_VARIANTS) & df.metric.isin(list(GATE_METRICS))]
    if g.empty:
        return pd.DataFrame()
    order = [v for v in rebuild.ALL_VARIANTS if v in set(g.variant)]
    t = g.pivot_table(index="variant", columns="metric", values="value").reindex(order)
    return t[list(GATE_METRICS)].astype(int)


def trace_table(df: pd.DataFrame) -> pd.DataFrame:
    """Method 2 on: what the traced pass saw, per token count and variant (rows ``trace_*``)."""
    t = _per_token(df)
    t = t[t.metric.str.startswith("trace_")]
    if t.empty:
        return pd.DataFrame()
    w = t.pivot_table(index=["num_tokens", "variant"], columns="metric", values="value")
    w.columns = [c.replace("trace_", "") for c in w.columns]
    cols = "kernels kernel_launches graph_launches device_us span_us busy copy_ops copy_us host_us"
    return w[cols.split()]


def copy_explanation(df: pd.DataFrame) -> pd.DataFrame:
    """Per traced token count: piecewise − eager device time and the extra copies' part, in µs."""
    tr = trace_table(df)
    if tr.empty:
        return pd.DataFrame()
    e, pw, lat = tr.xs("eager", level=1), tr.xs("piecewise", level=1), latency_table(df)
    extra_dev, extra_copy = pw.device_us - e.device_us, pw.copy_us - e.copy_us
    return pd.DataFrame({
        "extra device µs": extra_dev, "extra copy µs": extra_copy,
        "copy share of extra device time": (extra_copy / extra_dev).where(extra_dev > 0),
        "extra copy ops": pw.copy_ops - e.copy_ops,
        "timed gap µs (medians)": (lat["piecewise median ms"] - lat["eager median ms"]).reindex(
            e.index) * 1e3
    })


def kernel_summary(table: pd.DataFrame, top: int = 8) -> pd.DataFrame:
    """The per-kernel sidecar: per label the ``top`` kernels by time, the rest summed."""
    out, table = [], table.assign(short=table.kernel.map(kernel_table.short_name))
    for label, g in table.groupby("label", sort=False):
        g = g.sort_values("total_us", ascending=False)
        out.append(g.head(top)[["label", "short", "calls", "median_us", "total_us", "share"]])
        rest = g.iloc[top:]
        if len(rest):
            out.append(
                pd.DataFrame([
                    dict(label=label, short=f"({len(rest)} more)", calls=rest.calls.sum(),
                         median_us=float("nan"), total_us=rest.total_us.sum(),
                         share=rest.share.sum())
                ]))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def host_line(run) -> str:
    """The host's per-launch cost of a run, beside which its small-prefill figures stand."""
    lt = launch_table(run.df)
    if lt.empty:
        return (f"{run.label}: host per-launch cost not measured (method "
                f"{run.manifest.method_version}); its small-prefill times and speed-ups "
                "hold for the host that ran it")
    ev = lt["host µs/launch (CUDA events)"].median()
    return (f"{run.label}: host per-launch cost {lt['host µs/launch'].median():.1f} µs "
            f"(time.perf_counter; {ev:.1f} µs by CUDA events), median over the timed counts: the "
            "small-prefill times and speed-ups scale with it and hold for this host")


# -- the GPU sections of the notebook --------------------------------------------------------------
def summary(run) -> str:
    """What the gate decided and what the capture cost, from one run."""
    f = run_facts(run.df)
    on_off = {1.0: "PCG on", 0.0: "PCG off"}
    out = (f"{run.label}: gate for no_alias → {on_off[f[('eager', 'gate_enabled')]]} (eager "
           f"prefill), for property_guard → {on_off[f[('piecewise', 'gate_enabled')]]} "
           f"(piecewise prefill)\n  capture: {f[('piecewise', 'graphs')]:.0f} graphs "
           f"({f[('piecewise', 'buckets')]:.0f} buckets) in {f[('piecewise', 'capture_time')]:.1f}"
           f" s; graph pool {f[('piecewise', 'graph_pool')]:.0f} MiB, fixed buffers "
           f"{f[('piecewise', 'static_buffers')]:.0f} MiB, weights {f[('eager', 'weights')]:.0f}"
           " MiB")
    if ("process", "peak_allocated") in f:
        out += f", peak allocated {f[('process', 'peak_allocated')]:.0f} MiB"
    tr = trace_table(run.df)
    if not tr.empty:
        n = min(i[0] for i in tr.index)
        e, p = tr.loc[(n, "eager")], tr.loc[(n, "piecewise")]
        out += (f"\n  one prefill of {n} tokens (traced): eager {e.kernels:.0f} kernels, each "
                f"launched from Python; piecewise {p.kernels:.0f} kernels from "
                f"{p.graph_launches:.0f} graph launches + {p.kernel_launches:.0f} eager kernel "
                "launches (attention)")
    return out


def reading(run) -> str:
    """Small prefills (launch-bound) and large ones (where piecewise loses), one run."""
    lat = latency_of(run)
    sp, small = lat["speedup"], lat[lat.index <= 1024]
    lines = [
        f"{run.manifest.gpu}: eager/piecewise {sp.min():.2f}x to {sp.max():.2f}x (max at "
        f"{sp.idxmax()} tokens); eager median {small['eager median ms'].min():.2f}-"
        f"{small['eager median ms'].max():.2f} ms over {small.index.min()}-"
        f"{small.index.max()} tokens, piecewise {small['piecewise median ms'].min():.2f}-"
        f"{small['piecewise median ms'].max():.2f} ms"
    ]
    start = slowdown_start(sp)
    for n in (lat.index[lat.index >= start] if start is not None else []):
        gap_ms = lat.loc[n, "piecewise median ms"] - lat.loc[n, "eager median ms"]
        moved = buffer_copy_bytes(run.manifest.params, lat.loc[n, "bucket"])
        line = (f"    {n:5d} tokens: piecewise {gap_ms:+.2f} ms ({sp[n]:.2f}x); the copies move "
                f"{moved / 1e9:.2f} GB = {moved / 1e12 / (gap_ms / 1e3):.1f} TB/s if they were the "
                "whole gap")
        if "speedup_direct" in lat and lat.loc[n, "speedup_direct"] == lat.loc[n, "speedup_direct"]:
            line += f"; without them: {lat.loc[n, 'speedup_direct']:.3f}x"
        lines.append(line)
    return "\n".join(lines)


# -- the real engine's runs (data/recorded/engine_pcg_gate/) ---------------------------------------
def _swept(case) -> bool:
    return bool(sglang.WIDTH_CASE.match(str(case)))


def captured_over_off(df: pd.DataFrame, stat: str = STAT) -> dict:
    """``{(model, release, on-case): {input_len: (off / on, lo, hi)}}`` of the captured cases."""
    pcg, wide = engine_stats.texts(df, "pcg"), {sglang.FULL_BENCH.model, sglang.RANK_BENCH.model}
    return {
        k: r
        for k, r in engine_stats.ratios(df, "prefill", "input_len", "pcg-off", stat).items()
        if not _swept(k[2]) and k[0] not in wide and pcg.get(k) == "captured"
    }


def engine_ratios(df: pd.DataFrame, stat: str = STAT) -> dict:
    """``{(model, release, on-case): {input_len: off / on}}`` (:func:`captured_over_off`)."""
    return {k: {n: x[0] for n, x in r.items()} for k, r in captured_over_off(df, stat).items()}


def launch_counts(df: pd.DataFrame) -> pd.DataFrame:
    """The launch pass's counts, ``pcg`` and ``cap`` per (model, release, case, tokens)."""
    if "metric" not in df:
        return pd.DataFrame()
    d = pd.concat(
        engine_stats.numbers(df, metric).assign(count=col)
        for metric, col in (("prefill_kernel_launches", "kernels"), ("prefill_graph_launches",
                                                                     "graphs")))
    if d.empty:
        return pd.DataFrame()
    d = d.assign(tokens=d["input_len"].astype(int), value=d["value"].astype(int))
    out = d.pivot_table(index=[*engine_records.KEYS, "tokens"], columns="count", values="value",
                        aggfunc="last", fill_value=0)
    out = out.reindex(columns=["kernels", "graphs"], fill_value=0).rename_axis(columns=None)
    variants = [k[:3] for k in out.index]
    pcg, cap = engine_stats.texts(df, "pcg"), engine_stats.texts(df, "pcg_tokens")
    return out.assign(
        launches=out["kernels"] + out["graphs"], pcg=[pcg.get(k, "") for k in variants],
        cap=[max(map(int, re.findall(r"\d+", str(cap.get(k, "")))), default=0) for k in variants])


def _gain(on: tuple, off: tuple) -> dict:
    """Off over on, each ``(value, lo, hi, starts)``; ``lo``–``hi`` the widest the starts allow."""
    return dict(gain=off[0] / on[0], lo=off[1] / on[2], hi=off[2] / on[1],
                starts=min(on[3], off[3]))


def prefill_sides(df: pd.DataFrame) -> dict:
    """``{(model, release, case, input_len): (value, lo, hi, starts)}`` of prefill."""
    d = engine_stats.reading(df, "prefill", STAT)
    return {(*k, int(n)): (v, lo, hi, int(st))
            for k, n, v, lo, hi, st in zip(d[engine_records.KEYS].itertuples(
                index=False), d["input_len"], d["value"], d["lo"], d["hi"], d["starts"])}


def width_gains(df: pd.DataFrame) -> pd.DataFrame:
    """The width sweep: per hidden size and input length, prefill off over captured."""
    pcg, arms = engine_stats.texts(df, "pcg"), {}
    for (model, rel, case, n), side in prefill_sides(df).items():
        m = sglang.WIDTH_CASE.match(case)
        if m and (m["arm"] == "off" or pcg.get((model, rel, case)) == "captured"):
            arms[(int(m["hidden"]), n, m["arm"])] = side
    rows = [{"hidden": h, "tokens": n, **_gain(on, arms[(h, n, "off")])}
            for (h, n, arm), on in sorted(arms.items()) if arm == "pcg" and (h, n, "off") in arms]
    return pd.DataFrame(rows, columns=["hidden", "tokens", "gain", "lo", "hi", "starts"])


def layers_of(model: str) -> int:
    """The decoder layers of a committed engine model (data/models/<model>/config.json)."""
    cfg = spec.text_config(spec.load_config(runs.repo_root() / "data" / "models" / model))
    return int(cfg["num_hidden_layers"])


KIMI_LAYERS = 61  # Kimi-K2.5's decoder layers (1 dense + 60 MoE)


def whole_model(df: pd.DataFrame) -> pd.DataFrame:
    """An estimate: each full-width prefill step and its saving scaled by 61 ÷ its layers."""
    t = _per_case(df[df["tool"] == "bench"], "prefill") if "tool" in df else pd.DataFrame()
    if t.empty:
        return t
    scale = t.index.get_level_values("model").map(lambda m: KIMI_LAYERS / layers_of(m))
    return pd.DataFrame({
        "layers run": t.index.get_level_values("model").map(layers_of),
        "off (ms)": t["pcg-off"].round(2), "enforced (ms)": t["enforce"].round(2),
        "61 layers, off (ms, est.)": (t["pcg-off"] * scale).round(0),
        "61 layers, saved (ms, est.)": ((t["pcg-off"] - t["enforce"]) * scale).round(0)
    })


# the full-width scenarios' models on the width figure: hidden size, label
FULL_WIDTH = {
    sglang.FULL_BENCH.model: (7168, "Kimi-K2.5 layers, hidden 7168 (MLA, 384 experts)"),
    sglang.RANK_BENCH.model: (7168, "one TP-4 rank of them (heads and MLPs ÷ 4)")
}


def full_width_gains(df: pd.DataFrame) -> pd.DataFrame:
    """The full-width runs read as :func:`width_gains`; ``replayed``: the enforced step's graphs."""
    cols = ["model", "hidden", "label", "tokens", "gain", "lo", "hi", "starts", "replayed"]
    if df.empty or not df["model"].isin(FULL_WIDTH).any():
        return pd.DataFrame(columns=cols)
    df = df[df["model"].isin(FULL_WIDTH) & (df["release"] == sglang.FULL_BENCH.releases[-1])]
    side = {(m, c, n): x for (m, _, c, n), x in prefill_sides(df).items()}
    g = engine_stats.numbers(df, "prefill_graph_launches")
    graphs = {} if g.empty else dict(
        zip(zip(g["model"], g["case"], g["input_len"].astype(int)), g["value"]))
    rows = []
    for (m, case, n), on in sorted(side.items()):
        off = side.get((m, "pcg-off", n))
        if case != "enforce" or off is None:
            continue
        g = graphs.get((m, case, n))
        rows.append(
            dict(model=m, hidden=FULL_WIDTH[m][0], label=FULL_WIDTH[m][1], tokens=n,
                 **_gain(on, off), replayed=None if g is None else bool(g > 0)))
    return pd.DataFrame(rows, columns=cols)


# the launch pass's kernel time per prefill step (sglab.sglang.engine.trace.FAMILIES), as shown
KERNEL_TIMES = (("prefill_gpu_ms", "all kernels"), ("prefill_attention_ms", "attention"),
                ("prefill_moe_ms", "MoE"))


def _per_case(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """``metric`` (starts' median) of the full-width models per prompt tokens, a column per case."""
    d = engine_stats.numbers(df, metric) if not df.empty else df
    d = d[d["model"].isin(FULL_WIDTH)] if not d.empty else d
    d = d[d.release == sglang.FULL_BENCH.releases[-1]] if not d.empty else d
    if d.empty:
        return pd.DataFrame()
    t = d.pivot_table(index=["model", "input_len"], columns="case", values="value")
    t.index = t.index.set_levels(t.index.levels[1].astype(int), level=1)
    t.index.names = ["model", "prompt tokens"]
    return t


def kernel_times(df: pd.DataFrame) -> pd.DataFrame:
    """Per full-width model and prompt tokens, one prefill step's kernel time, off and enforced."""
    parts = []
    for metric, name in KERNEL_TIMES:
        t = _per_case(df, metric)
        if {"enforce", "pcg-off"} <= set(t.columns):
            off, on = t["pcg-off"], t["enforce"]
            parts.append(
                pd.DataFrame({
                    f"{name}, off (ms)": off, f"{name}, enforced (ms)": on,
                    f"{name}, enforced ÷ off": on / off
                }))
    return pd.concat(parts, axis=1) if parts else pd.DataFrame()
