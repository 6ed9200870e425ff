"""Tables from a pcg_gate run (live or recorded, method 1 or 2): latency per token count, correctness, the gate
per wrapper variant, what the traced pass saw, the per-kernel table."""

from __future__ import annotations

from typing import Optional

import pandas as pd

from sglab.core import runs as _runs

gpu_short = _runs.gpu_short
TIMES = (("time_median", "median"), ("time_p10", "p10"), ("time_p90", "p90"))
CHECKS = ("max_abs_diff", "rel_rms_diff", "tolerance", "within_tol", "max_abs_diff_same_shape")


def newest_per_gpu(all_runs: list) -> list:
    """The newest run of each GPU model, ordered by GPU name (several recorded runs of one GPU: newest wins)."""
    return list(_runs.newest_by(all_runs, _runs.gpu_short).values())


def _per_token(df: pd.DataFrame) -> pd.DataFrame:
    d = df.dropna(subset=["num_tokens"]).copy()
    d["num_tokens"] = d["num_tokens"].astype(int)
    return d


def latency_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per timed token count: eager and piecewise median/p10/p90 (ms), speedup (eager / piecewise median), the
    correctness columns, and (method 2, where measured) the direct hand-off's median and speedup."""
    d = _per_token(df)
    t = d[d["metric"].isin([m for m, _ in TIMES])]
    wide = t.pivot_table(index="num_tokens", columns=["variant", "metric"], values="value")
    out = pd.DataFrame(index=wide.index)
    for mode in ("eager", "piecewise"):
        for m, lab in TIMES:
            out[f"{mode} {lab} ms"] = wide[(mode, m)]
    out["speedup"] = out["eager median ms"] / out["piecewise median ms"]
    if ("piecewise_direct", "time_median") in wide.columns:
        out["direct median ms"] = wide[("piecewise_direct", "time_median")]
        out["speedup_direct"] = out["eager median ms"] / out["direct median ms"]
    c = d[d["metric"].isin(CHECKS) & (d["variant"] == "piecewise")]
    cw = c.pivot_table(index="num_tokens", columns="metric", values="value").reindex(out.index)
    buckets = d.dropna(subset=["bucket"]).groupby("num_tokens")["bucket"].first()
    out.insert(0, "bucket", buckets.reindex(out.index).astype(int))
    for col in ("max_abs_diff", "rel_rms_diff", "tolerance", "max_abs_diff_same_shape"):
        out[col] = cw[col]
    out["within_tol"] = cw["within_tol"].astype(bool)
    return out


def run_facts(df: pd.DataFrame) -> dict:
    """The run-level numbers (capture time, graph count, pool size, weights, ...) as ``(variant, metric) -> value``."""
    g = df[df["num_tokens"].isna()]
    return {(r.variant, r.metric): r.value for r in g.itertuples()}


def by_gpu(all_runs: list, column: str) -> pd.DataFrame:
    """One column of :func:`latency_table` side by side: token counts x GPU (newest run per GPU)."""
    return pd.DataFrame({gpu_short(r): latency_table(r.df)[column] for r in newest_per_gpu(all_runs)})


def slowdown_start(speedup: pd.Series) -> Optional[int]:
    """The smallest token count from which every measured ratio is below 1 (None if the last one is not)."""
    start = None
    for n, s in speedup.sort_index(ascending=False).items():
        if s >= 1.0:
            break
        start = int(n)
    return start


def speedup_threshold(speedup: pd.Series) -> Optional[int]:
    """The largest token count up to which every measured ratio is above 1 (None if the first one is not)."""
    last = None
    for n, s in speedup.sort_index().items():
        if s <= 1.0:
            break
        last = int(n)
    return last


def buffer_copy_bytes(params: dict, num_tokens: int) -> int:
    """Bytes the copy hand-off moves on top of the eager forward, per prefill: per layer it copies the residual and
    q, k, v into its fixed buffers and the attention output once more (5 tensors of ``tokens x hidden`` bf16, each
    written and read back), plus the final output once."""
    from sglab.experiments.pcg_gate.run import DEFAULT_PARAMS

    p = {**DEFAULT_PARAMS, **params}
    per_tensor = int(num_tokens) * int(p["hidden"]) * 2
    return 2 * per_tensor * (5 * int(p["num_layers"]) + 1)


def gate_table(df: pd.DataFrame) -> pd.DataFrame:
    """Method 2: the gate per wrapper variant around the measured LLM (decision and key counts)."""
    from sglab.experiments.pcg_gate.variants import ALL_VARIANTS, GATE_METRICS

    g = df[df["variant"].isin(ALL_VARIANTS) & df["metric"].isin([m for m, _ in GATE_METRICS])]
    if g.empty:
        return pd.DataFrame()
    t = g.pivot_table(index="variant", columns="metric", values="value").reindex(
        [v for v in ALL_VARIANTS if v in set(g["variant"])])
    return t[[m for m, _ in GATE_METRICS]].astype(int)


def trace_table(df: pd.DataFrame) -> pd.DataFrame:
    """Method 2: what the traced pass saw, per token count and variant (rows ``trace_*``)."""
    t = _per_token(df)
    t = t[t["metric"].str.startswith("trace_")]
    if t.empty:
        return pd.DataFrame()
    w = t.pivot_table(index=["num_tokens", "variant"], columns="metric", values="value")
    w.columns = [c.replace("trace_", "") for c in w.columns]
    return w[["kernels", "kernel_launches", "graph_launches", "device_us", "span_us", "busy", "copy_ops", "copy_us",
              "host_us"]]


def copy_explanation(df: pd.DataFrame) -> pd.DataFrame:
    """Per traced token count: the piecewise - eager difference in device time, the part of it that the extra copy
    kernels and memcpys take, and the timed gap (medians), all in µs."""
    tr = trace_table(df)
    if tr.empty:
        return pd.DataFrame()
    lat = latency_table(df)
    rows = []
    for n in sorted({i[0] for i in tr.index}):
        e, pw = tr.loc[(n, "eager")], tr.loc[(n, "piecewise")]
        extra_dev = pw["device_us"] - e["device_us"]
        extra_copy = pw["copy_us"] - e["copy_us"]
        gap = (lat.loc[n, "piecewise median ms"] - lat.loc[n, "eager median ms"]) * 1e3 if n in lat.index else None
        rows.append({"num_tokens": n, "extra device µs": extra_dev, "extra copy µs": extra_copy,
                     "copy share of extra device time": extra_copy / extra_dev if extra_dev > 0 else float("nan"),
                     "extra copy ops": pw["copy_ops"] - e["copy_ops"], "timed gap µs (medians)": gap})
    return pd.DataFrame(rows).set_index("num_tokens")


def kernel_summary(table: pd.DataFrame, top: int = 8) -> pd.DataFrame:
    """The per-kernel sidecar reduced for reading: per label, the ``top`` kernels by time and the rest summed."""
    from sglab.core.kernel_table import short_name

    out = []
    table = table.assign(short=table.kernel.map(short_name))  # names as this version shortens them
    for label, g in table.groupby("label", sort=False):
        g = g.sort_values("total_us", ascending=False)
        head, rest = g.head(top), g.iloc[top:]
        out.append(head[["label", "short", "calls", "median_us", "total_us", "share"]])
        if len(rest):
            out.append(pd.DataFrame([{"label": label, "short": f"({len(rest)} more kernel{'s' if len(rest) > 1 else ''})",
                                      "calls": rest.calls.sum(), "median_us": float("nan"),
                                      "total_us": rest.total_us.sum(), "share": rest.share.sum()}]))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


# --------------------------------------------------------------------------------------------------------------
# sentences for the notebook (numbers from the run, words around them)
# --------------------------------------------------------------------------------------------------------------
def run_summary(run) -> str:
    """What the gate decided and what the capture cost, from one run."""
    lat, f = latency_table(run.df), run_facts(run.df)
    on_off = {1.0: "PCG on", 0.0: "PCG off"}
    text = (f"{run.label}: gate for no_alias → {on_off[f[('eager', 'gate_enabled')]]} (eager prefill), for "
            f"property_guard → {on_off[f[('piecewise', 'gate_enabled')]]} (piecewise prefill)\n"
            f"  capture: {f[('piecewise', 'graphs')]:.0f} graphs ({f[('piecewise', 'buckets')]:.0f} buckets) in "
            f"{f[('piecewise', 'capture_time')]:.1f} s; graph pool {f[('piecewise', 'graph_pool')]:.0f} MiB, fixed "
            f"buffers {f[('piecewise', 'static_buffers')]:.0f} MiB, weights {f[('eager', 'weights')]:.0f} MiB")
    if ("process", "peak_allocated") in f:
        text += f", peak allocated {f[('process', 'peak_allocated')]:.0f} MiB"
    tr = trace_table(run.df)
    if not tr.empty:
        n = min(i[0] for i in tr.index)
        e, p = tr.loc[(n, "eager")], tr.loc[(n, "piecewise")]
        text += (f"\n  one prefill of {n} tokens (traced): eager {e.kernels:.0f} kernels, each launched from Python; "
                 f"piecewise {p.kernels:.0f} kernels from {p.graph_launches:.0f} graph launches + "
                 f"{p.kernel_launches:.0f} eager kernel launches (attention and its output copy)")
    elif ("eager", "kernels_per_forward") in f:
        ke, kp = f[("eager", "kernels_per_forward")], f[("piecewise", "kernels_per_forward")]
        text += (f"\n  kernels per forward at {lat.index.min()} tokens: eager {ke:.0f}, piecewise {kp:.0f} "
                 f"({kp - ke:+.0f}: copies into and out of the fixed buffers)")
    return text


def reading(run) -> str:
    """Small prefills (launch-bound) and large ones (where piecewise loses), one run."""
    lat = latency_table(run.df)
    sp, small = lat["speedup"], lat[lat.index <= 1024]
    lines = [f"{gpu_short(run)}: eager/piecewise {sp.min():.2f}x to {sp.max():.2f}x (max at {sp.idxmax()} tokens); "
             f"eager median {small['eager median ms'].min():.2f}-{small['eager median ms'].max():.2f} ms over "
             f"{small.index.min()}-{small.index.max()} tokens, piecewise {small['piecewise median ms'].min():.2f}-"
             f"{small['piecewise median ms'].max():.2f} ms"]
    start = slowdown_start(sp)
    for n in (lat.index[lat.index >= start] if start is not None else []):
        gap_ms = lat.loc[n, "piecewise median ms"] - lat.loc[n, "eager median ms"]
        moved = buffer_copy_bytes(run.manifest["params"], lat.loc[n, "bucket"])
        line = (f"    {n:5d} tokens: piecewise {gap_ms:+.2f} ms ({sp[n]:.2f}x); the copies move {moved / 1e9:.2f} GB "
                f"= {moved / 1e12 / (gap_ms / 1e3):.1f} TB/s if they were the whole gap")
        if "speedup_direct" in lat and lat.loc[n, "speedup_direct"] == lat.loc[n, "speedup_direct"]:
            line += f"; without them: {lat.loc[n, 'speedup_direct']:.3f}x"
        lines.append(line)
    return "\n".join(lines)


def correctness(run) -> str:
    lat = latency_table(run.df)
    nonzero = lat.index[lat["max_abs_diff"] > 0].tolist()
    verdict = "within" if lat["within_tol"].all() else "NOT within"
    return (f"{gpu_short(run)}: piecewise vs eager {verdict} bf16 tolerance at all {len(lat)} token counts; largest "
            f"difference {lat['max_abs_diff'].max():.3g} (tolerance {lat['tolerance'].min():.3g}); "
            + (f"bit-identical except at {nonzero} tokens; " if nonzero else "bit-identical at every count; ")
            + f"vs the same padded shape: largest {lat['max_abs_diff_same_shape'].max():.3g}")
