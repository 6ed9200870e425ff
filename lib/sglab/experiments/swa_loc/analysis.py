"""Tables from a run: kernel counts per layout, replay times, the profiler's view, the eager kernel table.

Everything here reads a :class:`sglab.core.runs.Run` (or its frame / sidecars) and works on recorded and live runs
alike; the claims and the figures are built from these tables.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Dict, Optional

from sglab.core import runs

VARIANT_LABELS = {"before": "before (translate inside the graph)", "pr23552": "#23552 (preset, int64 buffer)",
                  "pr24743": "#24743 (preset, int32, zeroed on pad)"}
_CFG = ["swa_per_full", "num_layers", "n_swa_layers"]

short_gpu = runs.gpu_short


def sweep_rows(df):
    """The rows of the layout sweep (not those of the padding scenario)."""
    return df[df.num_layers.isin(df[df.metric == "graph_kernel_nodes"].num_layers.unique())
              & ~df.metric.str.startswith("pad_")]


def kernel_counts(df):
    """Per (layout, batch size): static kernel nodes and profiled kernels per replay of each variant."""
    d = sweep_rows(df)
    idx = _CFG + ["batch_size"]
    nodes = d[d.metric == "graph_kernel_nodes"].pivot_table(index=idx, columns="variant", values="value")
    prof = d[d.metric == "profiled_kernels"].pivot_table(index=idx, columns="variant", values="value")
    return nodes.astype(int), prof.astype(int)


def extra_per_swa_layer(df, a: str = "before", b: str = "pr24743"):
    """Kernel nodes of ``a`` minus ``b``, per SWA layer, for every (layout, batch size)."""
    nodes, _ = kernel_counts(df)
    return (nodes[a] - nodes[b]) / nodes.index.get_level_values("n_swa_layers")


def kernel_table(df):
    """One row per layout: kernel nodes of each variant (checked equal for every batch size), the extra
    kernels per SWA layer, whether the profiler saw the same number in one replay, translate calls in capture."""
    nodes, prof = kernel_counts(df)
    d = sweep_rows(df)
    calls = d[d.metric == "translate_calls_capture"].pivot_table(index=_CFG, columns="variant", values="value",
                                                                 aggfunc="max")
    per_layout = nodes.groupby(level=_CFG)
    out = per_layout.first()
    out.columns = [f"kernels {c}" for c in out.columns]
    n_swa = out.index.get_level_values("n_swa_layers")
    out["same for every batch size"] = (per_layout.nunique() == 1).all(axis=1)
    out["+ per SWA layer: before vs #24743"] = (out["kernels before"] - out["kernels pr24743"]) / n_swa
    out["+ per SWA layer: #24743 vs #23552"] = (out["kernels pr24743"] - out["kernels pr23552"]) / n_swa
    out["profiler = static (all bs)"] = (prof == nodes).all(axis=1).groupby(level=_CFG).all()
    out["translate calls in capture (before)"] = calls["before"].astype(int)
    return out


def profiler_agreement(df) -> Dict[str, int]:
    """How many (layout, batch size, variant) cells have profiler count == static count, and the largest gap."""
    nodes, prof = kernel_counts(df)
    gap = (prof - nodes).abs()
    return {"cells": int(gap.size), "equal": int((gap == 0).sum().sum()), "max_abs_diff": int(gap.max().max())}


def time_table(df):
    """Median replay time per variant (µs), before/#24743 ratio and µs saved per SWA layer, per layout × bs."""
    import pandas as pd

    d = sweep_rows(df)
    med = d[d.metric == "time_median"].pivot_table(index=_CFG + ["batch_size"], columns="variant",
                                                   values="value") * 1e3
    out = pd.DataFrame({f"{v} µs": med[v] for v in med.columns})
    out["before / #24743"] = med["before"] / med["pr24743"]
    out["#24743 / #23552"] = med["pr24743"] / med["pr23552"]
    out["µs saved per SWA layer"] = (med["before"] - med["pr24743"]) / med.index.get_level_values("n_swa_layers")
    return out


def time_spread(df, *, num_layers: int, swa_per_full: int):
    """Median and p10 / p90 of the replay time (µs) per (batch size, variant) of one layout."""
    d = sweep_rows(df)
    d = d[(d.num_layers == num_layers) & (d.swa_per_full == swa_per_full) & d.metric.str.startswith("time_")]
    return d.pivot_table(index=["batch_size", "variant"], columns="metric", values="value") * 1e3


def pad_table(df):
    """The padding scenario per variant: corrupted and predicted (layer, slot) pairs, exact match."""
    return df[df.metric.str.startswith("pad_")].pivot_table(index="variant", columns="metric",
                                                            values="value").astype(int)


# ---------------------------------------------------------------------------------------------------------------
# the profiler's view (sidecars of method-2 runs)
# ---------------------------------------------------------------------------------------------------------------
def translation_kernels(graph_kernels, a: str = "before", b: str = "pr24743") -> Dict[str, int]:
    """Kernel names with more nodes in ``a``'s graph than in ``b``'s, and by how many: what the preset removes."""
    def counts(v):
        rows = graph_kernels[graph_kernels.variant == v]
        return Counter(dict(zip(rows.kernel, rows.nodes.astype(int))))

    return dict(counts(a) - counts(b))


def name_pattern(names) -> Optional[str]:
    """A regular expression matching exactly these kernel names (for a timeline's highlight)."""
    names = sorted(set(names))
    return "^(?:" + "|".join(re.escape(n) for n in names) + ")$" if names else None


def trace_counts(events, pattern: Optional[str] = None) -> Dict[str, Dict[str, int]]:
    """Per variant of a traced replay: kernels on the device, and how many of them match ``pattern``."""
    rx = re.compile(pattern) if pattern else None
    out = {}
    for v, ev in events[events.category == "kernel"].groupby("variant", sort=False):
        out[v] = {"kernels": int(len(ev)), "matching": int(sum(bool(rx.search(n)) for n in ev.name)) if rx else 0}
    return out


_KEY_PARTS = [(r"index_put_kernel_impl<at::native::OpaqueType<(\d+)>", r"index_put<\1B>"),
              (r"index_kernel_impl<at::native::OpaqueType<(\d+)>", r"index gather<\1B>"),
              (r"direct_copy_kernel_cuda.*?\{lambda\((?:c10::)?(\w+)\)#1\}", r"copy -> \1"),
              (r"(\w+Functor\w*)(?!.*Functor)", r"\1")]  # the innermost functor: MulFunctor, not AUnaryFunctor


def short_kernel(name: str) -> str:
    """A readable kernel name: the kernel template and what distinguishes it (``index_elementwise_kernel ·
    index gather<8B>``, ``unrolled_elementwise_kernel · copy -> int``); the name itself when nothing matches."""
    base = re.sub(r"^void\s+", "", str(name))
    head = re.split(r"[<(]", base, maxsplit=1)[0].split("::")[-1]
    for rx, repl in _KEY_PARTS:
        m = re.search(rx, base)
        if m:
            return f"{head} · {m.expand(repl)}"
    return head if len(base) > 60 else base


def eager_table(table, variant: Optional[str] = None):
    """The eager kernel table, one row per (variant, scope, step, op, kernel): calls and median µs per backend."""
    t = table if variant is None else table[table.variant == variant]
    t = t.assign(kernel=t.kernel.map(short_kernel), scope=t.scope.fillna("").replace("", "rest of the step"))
    wide = t.pivot_table(index=["variant", "scope", "step", "op", "kernel"], columns="backend",
                         values=["calls", "median_us"], aggfunc="first", sort=False)
    wide.columns = [f"{m} · {b}" for m, b in wide.columns]
    return wide


def kv_write_kernels(table, variant: str, backend: Optional[str] = None):
    """The SWA layers' KV write of one variant, in op order: step, op, kernel, calls, median µs."""
    from sglab.experiments.swa_loc.profile import SWA_WRITE

    t = table[(table.variant == variant) & (table.scope == SWA_WRITE)]
    if backend is not None:
        t = t[t.backend == backend]
    elif len(t):
        t = t[t.backend == t.backend.iloc[0]]
    return t.sort_values("step")[["step", "op", "kernel", "calls", "median_us"]].reset_index(drop=True)
