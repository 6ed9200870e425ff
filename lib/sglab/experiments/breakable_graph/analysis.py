"""Tables from a breakable_graph run (live or recorded, method 2 or 3)."""

from __future__ import annotations

import pandas as pd

from sglab.core import runs

gpu_short = runs.gpu_short


def newest_per_gpu(runs_: list) -> list:
    """The newest run of each GPU model, ordered by GPU name."""
    return list(runs.newest_by(runs_, runs.gpu_short).values())


def part(df: pd.DataFrame, name: str) -> pd.DataFrame:
    return df[df["part"] == name]


def latency_table(df: pd.DataFrame) -> pd.DataFrame:
    """Median latency per (num_tokens, batch_size) and variant, with speedups over eager."""
    d = df[(df["part"] == "d_latency") & (df["metric"] == "time_median")]
    t = d.pivot_table(index=["num_tokens", "batch_size"], columns="variant", values="value").reset_index()
    t["speedup_after"] = t["eager"] / t["after"]
    t["speedup_before"] = t["eager"] / t["before"]
    return t


def spread(df: pd.DataFrame, variant: str) -> pd.DataFrame:
    d = df[(df["part"] == "d_latency") & (df["variant"] == variant)]
    return d.pivot_table(index=["num_tokens", "batch_size"], columns="metric", values="value").reset_index()


def multi_request_speedups(df: pd.DataFrame) -> pd.Series:
    """Eager / after median latency for the batches with 2+ requests (all token counts)."""
    t = latency_table(df)
    return t[t["batch_size"] > 1]["speedup_after"]


def hit_rates(df: pd.DataFrame) -> dict:
    """{variant: {"hit_rate": ..., "token_hit_rate": ..., "graph_batches": ..., "batches": ...}} of part c."""
    c = df[(df["part"] == "c_hit_rate") & df["variant"].isin(["before", "after"])]
    return {v: dict(zip(g["metric"], g["value"])) for v, g in c.groupby("variant")}


def bs3_table(df: pd.DataFrame) -> pd.DataFrame:
    """Part a: the before graph replayed for 3 requests, against eager and the after graph."""
    return part(df, "a_bs3").pivot_table(index="variant", columns="metric", values="value")


def match_table(df: pd.DataFrame) -> pd.DataFrame:
    """Part b per token count: did every batch get one logit row per request, and the largest abs diff."""
    b = part(df, "b_match").pivot_table(index=["num_tokens", "padded", "batch_size"], columns=["variant", "metric"],
                                        values="value")
    rows = []
    for (n, padded), g in b.groupby(level=["num_tokens", "padded"]):
        bs = g.index.get_level_values("batch_size")
        rows.append({"num_tokens": int(n), "padded": bool(padded), "requests": f"{bs.min()}..{bs.max()}",
                     "rows == requests": bool((g[("after", "logit_rows")] == bs).all()),
                     "max abs diff": float(g[("after", "max_abs_diff")].max()),
                     "max abs logit (eager)": float(g[("eager", "max_abs_logit")].max())})
    return pd.DataFrame(rows)


def launch_table(df: pd.DataFrame) -> pd.DataFrame:
    """Host launches and device kernels per prefill, by request count and variant."""
    ln = df[(df["part"] == "launches") & (df["batch_size"] > 0)]
    return ln.pivot_table(index=["batch_size", "variant"], columns="metric", values="value").astype(int)


def segment_table(df: pd.DataFrame) -> pd.DataFrame:
    """Graph segments and eager breaks per captured bucket, per boundary."""
    seg = df[(df["part"] == "launches") & df["metric"].isin(["graph_segments", "eager_breaks"])]
    return seg.pivot_table(index="num_tokens", columns=["variant", "metric"], values="value").astype(int)


# --------------------------------------------------------------------------------------------------------------
# sentences for the notebook (numbers from the run, words around them)
# --------------------------------------------------------------------------------------------------------------
def speedup_lines(run) -> str:
    """Per token count: after vs eager over the multi-request batches, before (= eager), after's own spread."""
    lat = latency_table(run.df)
    multi = lat[lat["batch_size"] > 1]
    lines = [run.label]
    for n, g in multi.groupby("num_tokens"):
        after_all = lat[lat["num_tokens"] == n]["after"]
        lines.append(f"  {n:>5} tokens, {g['batch_size'].min()}..{g['batch_size'].max()} requests: after is "
                     f"{g['speedup_after'].min():.2f}–{g['speedup_after'].max():.2f}× faster than eager; before runs "
                     f"eager ({g['speedup_before'].min():.2f}–{g['speedup_before'].max():.2f}×); after itself "
                     f"{after_all.min():.2f}–{after_all.max():.2f} ms over 1..{lat['batch_size'].max()} requests")
    gap = (multi["before"] / multi["eager"] - 1).abs().max()
    lines.append(f"  noise check: 'before' and 'eager' (same eager code for 2+ requests) differ by up to {gap:.0%}")
    return "\n".join(lines)


def hit_rate_line(df: pd.DataFrame) -> str:
    hr = hit_rates(df)
    return (f"graph hit rate on the mixed stream: before {hr['before']['hit_rate']:.0%}, after "
            f"{hr['after']['hit_rate']:.0%} of batches ({hr['before']['token_hit_rate']:.0%} → "
            f"{hr['after']['token_hit_rate']:.0%} of tokens)")


def launch_line(run) -> str:
    lt = launch_table(run.df)
    bss = sorted(lt.index.get_level_values(0).unique())
    one, most = lt.loc[bss[0]], lt.loc[bss[-1]]
    n = int(run.df[(run.df["part"] == "launches") & (run.df["batch_size"] > 0)]["num_tokens"].iloc[0])
    return (f"{run.label}, {n} tokens: eager {most.loc['eager', 'host_kernel_launches']} kernel launches; after "
            f"{most.loc['after', 'host_kernel_launches']} + {most.loc['after', 'host_graph_launches']} graph launches "
            f"for any request count; the eager logits tail costs after "
            f"{one.loc['after', 'host_kernel_launches'] - one.loc['before', 'host_kernel_launches']} more kernel "
            "launches than the before graph for one request")
