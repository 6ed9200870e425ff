"""What a recorded real-SGLang GPU run says, in the shape a reader compares with the rebuild.

A recorded ``real_<fix>`` run is a tidy frame (release, variant, case, metric, value, unit). The notebooks show one
focused table per fix instead of every row: kernel nodes and replay time per release and variant for the SWA pool,
replay-vs-eager differences and graph shape for the breakable graph. Other fixes fall back to the tidy rows.
"""

from __future__ import annotations

SWA_METRICS = ["translate_calls", "kernel_nodes", "replay_kernels", "replay_us_median", "rows_landed"]
SWA_VARIANTS = ["per_layer", "once_in_graph", "preset"]


def _pivot(df, index: list[str], metrics: list[str]):
    rows = df[df["metric"].isin(metrics)]
    table = rows.pivot_table(index=index, columns="metric", values="value", aggfunc="first")
    return table[[m for m in metrics if m in table.columns]]


def swa_loc(df):
    """Per release × variant: translations during capture, kernel nodes, profiled kernels, replay µs; then per
    release the nodes per SWA layer (measured vs read from the release's translation code) and the decode
    buffer's dtype and padded tail (#24743)."""
    graphs = _pivot(df[df["variant"].isin(SWA_VARIANTS)], ["release", "variant"], SWA_METRICS)
    per_layer = _pivot(df[df["variant"] == "per_layer-preset"], ["release"],
                       ["nodes_per_swa_layer", "expected_nodes_per_swa_layer"])
    buffers = _pivot(df[df["variant"] == "decode_buffers"], ["release"],
                     ["has_out_cache_loc_swa", "dtype", "padded_tail_after_padded_populate"])
    return {"graphs": graphs, "per SWA layer": per_layer, "decode buffers (#24743)": buffers}


def breakable_graph(df):
    """Per release × side (real / rebuild) × case: requests and max |replay − eager|; graph segments and breaks."""
    cases = _pivot(df[df["variant"].isin(["real", "rebuild"]) & df["case"].notna()], ["release", "variant", "case"],
                   ["requests", "max_abs_diff_vs_eager_live", "max_abs_diff_vs_eager_bucket"])
    shape = _pivot(df[df["variant"].isin(["real", "rebuild"]) & df["case"].isna()], ["release", "variant"],
                   ["segments", "breaks"])
    return {"replay vs eager": cases, "graph shape": shape}


SUMMARIES = {"swa_loc": swa_loc, "breakable_graph": breakable_graph}


def tables(fix: str, df) -> dict:
    """Named tables for ``fix``'s recorded run; the tidy rows when the fix has no summary or its rows do not fit."""
    fn = SUMMARIES.get(fix)
    if fn is not None:
        try:
            return fn(df)
        except (KeyError, ValueError):
            pass
    return {"rows": df.drop(columns=[c for c in ("experiment",) if c in df.columns])}
