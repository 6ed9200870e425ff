"""Measure captured CUDA graphs of real SGLang code three ways, as tidy rows (runs inside a worker
process).

For each labelled graph: the kernel nodes of the captured graph (static, :func:`sglab.core.kernels.
graph_kernel_nodes`), the kernels torch.profiler sees in one replay (:func:`~sglab.core.kernels.
profiled_kernels`; the two must agree, which the rows let a reader check), the kernel names of the
nodes, and the replay time, every variant timed in interleaved rounds
(:func:`sglab.core.timing.interleaved`) so that clock drift lands on all of them alike.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable


def capture(fn: Callable[[], object], *, warmup: int = 2):
    """``fn`` captured into a kept, instantiated ``torch.cuda.CUDAGraph`` (eager warm-up on a side
    stream first: SGLang's JIT kernels build there, never inside the capture)."""
    from sglab.core.kernels import capture_graph

    return capture_graph(fn, warmup=warmup)


def count_rows(label: str, graph) -> list[dict]:
    """Static node count, profiled kernel count of one replay, and one row per distinct node kernel
    name."""
    from sglab.core.kernels import graph_kernel_nodes, profiled_kernels

    nodes = graph_kernel_nodes(graph)
    replayed = profiled_kernels(lambda: graph.replay())
    rows = [{"variant": label, "metric": "kernel_nodes", "value": nodes.kernels, "unit": "nodes"}, {
        "variant": label, "metric": "replay_kernels", "value": len(replayed), "unit": "kernels"
    }, {
        "variant": label, "metric": "graph_nodes_all_types", "value": sum(nodes.by_type.values()),
        "unit": "nodes"
    }]
    for name, n in sorted(Counter(nodes.names).items()):
        rows.append({
            "variant": label, "metric": "node_kernel", "kernel": name, "value": n, "unit": "nodes"
        })
    return rows


def timing_rows(graphs: dict, *, rounds: int = 5, warmup: int = 20,
                repeat: int = 200) -> list[dict]:
    """Replay time of each graph in microseconds (CUDA events, interleaved rounds): median, p10,
    p90, n."""
    from sglab.core.timing import interleaved

    timings = interleaved({label: g.replay
                           for label, g in graphs.items()}, rounds=rounds, warmup=warmup,
                          repeat=repeat)
    rows = []
    for label, t in timings.items():
        for metric, ms in (("replay_us_median", t.median_ms), ("replay_us_p10", t.p10_ms),
                           ("replay_us_p90", t.p90_ms)):
            rows.append({
                "variant": label, "metric": metric, "value": round(ms * 1e3, 3), "unit": "us"
            })
        rows.append({"variant": label, "metric": "replay_samples", "value": t.n, "unit": "samples"})
    return rows


def device_rows() -> list[dict]:
    """Which GPU the probe ran on (the manifest says the machine; this says the worker's device)."""
    import torch

    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (dry run)"
    return [{"variant": "setup", "metric": "device", "value": name, "unit": ""},
            {"variant": "setup", "metric": "torch", "value": torch.__version__, "unit": ""}]


def require_cuda(prepared) -> None:
    """A GPU probe on a machine without CUDA is "not run", with the reason, never an error."""
    import torch

    from sglab.sglang import bootstrap

    if not torch.cuda.is_available():
        raise bootstrap.NotRunnable(f"sglang {prepared.release}: no CUDA device in this process")
