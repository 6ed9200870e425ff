"""The profiler passes of a run, separate from the timed ones (GPU only, except the reductions the CPU tests use).

- :func:`traced_pass`: one replay of each variant's decode graph at ``trace_config`` under torch.profiler, each in
  a ``replay <variant>`` phase -> the ``events`` sidecar (and its Perfetto file), plus the kernel nodes of those
  graphs by name (``graph_kernels``): the static side of "which kernels does the preset remove".
- :func:`eager_kernel_tables`: one eager decode step before (every SWA layer translates) and after (the location
  preset, int32 as #24743's buffer) with each aten op in a labelled range, the SWA and full layers' KV writes
  marked -> ``eager_kernels``: per op, which kernel, how many calls, median time, from nsight-python's CUPTI
  backend and from torch.profiler (which check each other's counts). Eager because nsight-python's CUPTI mode
  attributes kernels by their launch call and a graph replay launches none of its own.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import torch

from sglab.fixes import swa_loc as fx
from sglab.core import kernel_table as op_kernels, kernel_table as ops, timing as phases, trace

TRACE_PHASE = "replay "  # + variant
SWA_WRITE, FULL_WRITE = "SWA layer KV write", "full layer KV write"
EAGER_VARIANTS = ("before", "pr24743")  # per-layer translation / preset int32 location


def gpu_probes() -> dict:
    from sglab.core.kernels import graph_kernel_nodes, profiled_kernels

    return {"graph_kernel_nodes": lambda runner, bs: graph_kernel_nodes(runner.graphs[bs]).kernels,
            "profiled_kernels": lambda runner, bs: len(profiled_kernels(lambda: runner.replay_graph(bs)))}


# ---------------------------------------------------------------------------------------------------------------
# traced replays
# ---------------------------------------------------------------------------------------------------------------
def reduce_events(events):
    """The events of the ``replay <variant>`` phases, with a ``variant`` column (host ops dropped)."""
    ev = events[events.phase.str.startswith(TRACE_PHASE) & (events.category != "op")].copy()
    ev["variant"] = ev.phase.str.slice(len(TRACE_PHASE))
    return ev.reset_index(drop=True)


def graph_kernel_names(runners: dict, bs: int):
    """Kernel nodes of each variant's ``bs`` graph by (demangled) kernel name: variant, kernel, nodes."""
    import pandas as pd

    from sglab.core.kernels import graph_kernel_nodes

    rows = []
    for v, r in runners.items():
        counts = Counter(ops.demangle(n) for n in graph_kernel_nodes(r.graphs[bs]).names)
        rows.extend({"variant": v, "kernel": k, "nodes": n} for k, n in counts.items())
    return pd.DataFrame(rows, columns=["variant", "kernel", "nodes"])


def traced_pass(runners: dict, bs: int) -> dict:
    """One profiled replay per variant (synchronised inside its phase, so no two overlap); the sidecars."""
    with phases.phase("trace"):
        path = Path(tempfile.mkdtemp(prefix="sglab-swa_loc-")) / "replays.trace.json.gz"
        with trace.Recorder(perfetto=path) as rec:
            for r in runners.values():  # a first profiled replay of each, outside any phase: profiler start-up
                r.replay_graph(bs)
            torch.cuda.synchronize()
            for v, r in runners.items():
                with trace.phase(TRACE_PHASE + v):
                    r.replay_graph(bs)
                    torch.cuda.synchronize()
        return {"events": reduce_events(rec.events), "trace": path, "graph_kernels": graph_kernel_names(runners, bs)}


# ---------------------------------------------------------------------------------------------------------------
# the eager kernel table
# ---------------------------------------------------------------------------------------------------------------
@contextmanager
def kv_write_scopes(pool: fx.SWAKVPool, mode: ops.OpRanges):
    """Label the ops of every ``set_kv_buffer`` call with the kind of layer it writes (the pool instance's method
    is wrapped for the duration; the rebuild itself stays unaware)."""
    original = pool.set_kv_buffer

    def labelled(layer_id, *args, **kwargs):
        with mode.scope(SWA_WRITE if pool.is_swa_layer(layer_id) else FULL_WRITE):
            return original(layer_id, *args, **kwargs)

    pool.set_kv_buffer = labelled
    try:
        yield
    finally:
        del pool.set_kv_buffer


def eager_steps(setup: fx.Setup, batch: fx.ForwardBatch) -> dict:
    """{variant: step(mode)} for the two eager decode steps; ``before`` clears the location an earlier step left."""
    def before(mode):
        setup.pool.set_swa_loc(None)
        with kv_write_scopes(setup.pool, mode):
            fx.forward_eager(setup.model, batch, use_precomputed_swa_loc=False)

    def after(mode):
        with kv_write_scopes(setup.pool, mode):
            fx.forward_eager(setup.model, batch, use_precomputed_swa_loc=True)

    return dict(zip(EAGER_VARIANTS, (before, after)))


def kv_write_ops(variant: str, *, num_layers: int = 6, swa_per_full: int = 5) -> list:
    """The aten ops of the KV writes in one replay of ``variant``'s captured step, on the CPU: what the decode
    graph holds, as :class:`sglab.core.kernel_table.OpCall` (scope = the kind of layer, step = position in its write)."""
    s = fx.build_setup(num_layers=num_layers, swa_per_full=swa_per_full, size=16, size_swa=8, head_num=1,
                       head_dim=4)
    runner = fx.DecodeGraphRunner.for_variant(s.model, [1], variant, use_cuda_graph=False)
    runner.capture()
    mode = ops.OpRanges()
    with kv_write_scopes(s.pool, mode), mode:
        runner.replay_graph(1)
    return [c for c in mode.calls if c.scope]


def eager_kernel_tables(p: dict, device) -> tuple:
    """The ``eager_kernels`` table (nsight-python first, then torch.profiler) and what ran: ``(table, info)``."""
    import pandas as pd

    from sglab.experiments.swa_loc.run import make_batches, setup_kwargs

    tc = p["eager_config"]
    s = fx.build_setup(**setup_kwargs(p, int(tc["num_layers"]), int(tc["swa_per_full"]), device))
    bs = int(tc["batch_size"])
    steps = eager_steps(s, make_batches(s, [bs], seed=p["seed"])[bs])
    runs_ = int(p["kernel_table_runs"])
    with phases.phase("eager kernel table: nsight-python"):
        ns, reason = op_kernels.nsight_table(steps, runs=runs_)
    with phases.phase("eager kernel table: torch.profiler"):
        tp = op_kernels.torch_table(steps, runs=runs_)
    table = pd.concat([t for t in (ns, tp) if t is not None], ignore_index=True)
    info = {"config": dict(tc), "runs": runs_, "backends": sorted(set(table.backend)),
            "nsight": "ran" if ns is not None else "did not run", "nsight_reason": reason}
    return table, info
