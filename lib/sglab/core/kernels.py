"""Count and time the kernels of a piece of GPU work three ways: statically (the kernel nodes of a
captured CUDA graph through cuda-bindings, child graphs included: exact, no profiler), dynamically
(what torch.profiler sees during one call, e.g. one ``graph.replay()``), and timed per annotated
region (nsight-python where the installed tools allow, else CUDA events; the same columns, with a
``backend`` column).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Mapping

# see sglab.core.trace: no profiler chatter on stderr
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

# CUgraphNodeType values (stable across CUDA 12/13); names used when the driver module gives none.
_NODE_TYPE_NAMES = {
    0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 4: "graph", 5: "empty", 6: "wait_event",
    7: "event_record", 8: "ext_semas_signal", 9: "ext_semas_wait", 10: "mem_alloc", 11: "mem_free",
    12: "batch_mem_op", 13: "conditional"
}
KERNEL, CHILD_GRAPH = 0, 4


@dataclass
class GraphNodes:
    """What a captured graph contains: kernel-node count, kernel names (when the driver gives them),
    and the count of every node type."""

    kernels: int = 0
    names: list[str] = field(default_factory=list)
    by_type: dict[str, int] = field(default_factory=dict)
    child_graphs: int = 0

    def name_counts(self) -> Counter:
        return Counter(self.names)


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError as e:  # pragma: no cover - exercised where cuda-bindings is missing
        raise RuntimeError("static kernel counting needs cuda-bindings (pip install 'sglab[gpu]' "
                           "or cuda-bindings)") from e
    return driver


def _check(result, what: str):
    """cuda-bindings returns (CUresult, *values); raise on an error code, return the values."""
    err, *values = result
    if int(err) != 0:
        raise RuntimeError(f"{what} failed with CUresult {int(err)} ({err!r})")
    if len(values) == 1:
        return values[0]
    return values


def _type_code(t) -> int:
    return int(t.value) if hasattr(t, "value") else int(t)


def _kernel_name(driver, node) -> str:
    try:
        params = _check(driver.cuGraphKernelNodeGetParams(node), "cuGraphKernelNodeGetParams")
        name = _check(driver.cuFuncGetName(params.func), "cuFuncGetName")
    except Exception:
        return "<unnamed>"
    return name.decode() if isinstance(name, bytes) else str(name)


def _walk(driver, graph, out: GraphNodes, depth: int = 0) -> None:
    if depth > 16:
        raise RuntimeError("child graphs nested deeper than 16 levels")
    _, n = _check(driver.cuGraphGetNodes(graph, 0), "cuGraphGetNodes(count)")
    if int(n) == 0:
        return
    nodes, _ = _check(driver.cuGraphGetNodes(graph, int(n)), "cuGraphGetNodes")
    for node in nodes[:int(n)]:
        code = _type_code(_check(driver.cuGraphNodeGetType(node), "cuGraphNodeGetType"))
        tname = _NODE_TYPE_NAMES.get(code, f"type_{code}")
        out.by_type[tname] = out.by_type.get(tname, 0) + 1
        if code == KERNEL:
            out.kernels += 1
            out.names.append(_kernel_name(driver, node))
        elif code == CHILD_GRAPH:
            out.child_graphs += 1
            child = _check(driver.cuGraphChildGraphNodeGetGraph(node),
                           "cuGraphChildGraphNodeGetGraph")
            _walk(driver, child, out, depth + 1)


def graph_kernel_nodes(graph, *, driver=None) -> GraphNodes:
    """Count the kernel nodes of a captured graph, recursing into child graphs.

    ``graph`` is a ``torch.cuda.CUDAGraph`` made with ``keep_graph=True`` (see
    :func:`capture_graph`) or a raw ``cudaGraph_t`` address (int). ``driver`` defaults to
    ``cuda.bindings.driver``; tests pass a fake.
    """
    driver = driver or _driver()
    raw = graph.raw_cuda_graph() if hasattr(graph, "raw_cuda_graph") else graph
    handle = driver.CUgraph(int(raw)) if isinstance(raw, int) else raw
    out = GraphNodes()
    _walk(driver, handle, out)
    return out


def capture_graph(fn: Callable[[], object], *, warmup: int = 2, pool=None, stream=None):
    """Capture ``fn`` into a ``torch.cuda.CUDAGraph(keep_graph=True)``, instantiated and ready to
    replay.

    ``fn`` runs ``warmup`` times eagerly on a side stream first (as torch recommends), then once
    under capture. The raw graph stays available for :func:`graph_kernel_nodes`.
    """
    import torch

    side = stream or torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(g, pool=pool, stream=stream):
        fn()
    g.instantiate()
    torch.cuda.synchronize()
    return g


_NON_KERNEL_PREFIXES = ("Memcpy", "Memset", "cudaMemcpy", "cudaMemset")

_PROFILER_WARM = False


def _warm_profiler() -> None:
    """The first profiling session of a process can miss kernels while CUPTI starts up: spend it on
    a throwaway kernel once."""
    global _PROFILER_WARM
    if _PROFILER_WARM:
        return
    import torch
    from torch.profiler import ProfilerActivity, profile

    x = torch.ones(16, device="cuda")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], acc_events=True):
        (x + 1).sum()
        torch.cuda.synchronize()
    _PROFILER_WARM = True


def profiled_kernels(fn: Callable[[], object]) -> list[str]:
    """Names of the GPU kernels torch.profiler records during one call of ``fn`` (memcpy/memset
    excluded), in launch order. For a graph, pass ``lambda: g.replay()``: the profiler reports the
    kernels inside."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    _warm_profiler()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], acc_events=True) as prof:
        fn()
        torch.cuda.synchronize()
    names = []
    for ev in sorted(prof.events(), key=lambda e: e.time_range.start):
        if (ev.device_type == torch.autograd.DeviceType.CUDA
                and not ev.name.startswith(_NON_KERNEL_PREFIXES)):
            names.append(ev.name)
    return names


# --------------------------------------------------------------------------------------------------
# nsight-python, with a CUDA-event fallback

NSIGHT_COLUMNS = [
    "label", "backend", "n", "median_ms", "p10_ms", "p90_ms", "mean_ms", "min_ms", "max_ms"
]
NCU_MIN_VERSION = (2026, 2, 1)


def ncu_version(executable: str = "ncu") -> tuple[int, ...] | None:
    """Version of Nsight Compute on PATH, e.g. (2025, 3, 1), or None."""
    path = shutil.which(executable)
    if not path:
        return None
    try:
        text = subprocess.run([path, "--version"], capture_output=True, text=True,
                              timeout=30).stdout
    except Exception:
        return None
    import re

    m = re.search(r"(\d{4})\.(\d+)\.(\d+)", text)
    return tuple(int(x) for x in m.groups()) if m else None


def nsight_backend() -> tuple[str, str]:
    """Which backend :func:`nsight_time` would use here, and why: ("cupti" | "ncu" | "cuda-events",
    reason)."""
    try:
        import nsight  # noqa: F401
    except ImportError:
        return "cuda-events", "nsight-python is not installed"
    try:
        from nsight.collection import cupti as _cupti

        if not getattr(_cupti, "CUPTI_AVAILABLE", False):
            raise ImportError("cupti-python is not importable")
        return "cupti", "nsight-python with CUPTI (cupti-python found)"
    except Exception as e:  # noqa: BLE001
        cupti_reason = f"CUPTI unavailable ({type(e).__name__}: {e})"
    v = ncu_version()
    if v is not None and v >= NCU_MIN_VERSION:
        return "ncu", f"nsight-python with Nsight Compute {'.'.join(map(str, v))}"
    ncu_reason = ("no ncu on PATH" if v is None else f"ncu {'.'.join(map(str, v))} is older than "
                  f"{'.'.join(map(str, NCU_MIN_VERSION))}")
    return "cuda-events", f"{cupti_reason}; {ncu_reason}"


def _events_frame(fns: Mapping[str, Callable[[], object]], runs: int, warmup: int, reason: str):
    import pandas as pd

    from sglab.core.timing import cuda_time

    rows = []
    for label, fn in fns.items():
        t = cuda_time(fn, warmup=warmup, repeat=runs)
        s = t.samples_ms
        rows.append({
            "label": label, "backend": "cuda-events", "n": t.n, "median_ms": t.median_ms,
            "p10_ms": t.p10_ms, "p90_ms": t.p90_ms, "mean_ms": sum(s) / len(s), "min_ms": min(s),
            "max_ms": max(s)
        })
    df = pd.DataFrame(rows, columns=NSIGHT_COLUMNS)
    df.attrs["backend"] = "cuda-events"
    df.attrs["reason"] = reason
    return df


def nsight_time(fns: Mapping[str, Callable[[], object]], *, runs: int = 20, warmup: int = 5,
                backend: str = "auto"):
    """Time each labelled eager function (one annotated region each) and return a DataFrame with
    :data:`NSIGHT_COLUMNS`. ``df.attrs["backend"]`` and ``df.attrs["reason"]`` say which backend ran
    and why.

    ``backend``: "auto" (nsight-python CUPTI, then NCU, else CUDA events), "cupti", "ncu" or
    "cuda-events". Kernels launched by a graph replay are not attributed by the CUPTI backend: use
    this for eager kernels.
    """
    import math

    import pandas as pd

    if not fns:
        raise ValueError("nsight_time needs at least one labelled function")
    if backend not in {"auto", "cupti", "ncu", "cuda-events"}:
        raise ValueError(f"unknown backend {backend!r}")
    chosen, reason = nsight_backend() if backend == "auto" else (backend, "requested")
    if chosen == "cuda-events":
        return _events_frame(fns, runs, warmup, reason)
    try:
        raw = nsight_session(fns, runs=runs, warmup=warmup, tool=chosen)
    except Exception as e:  # noqa: BLE001
        if backend != "auto":
            raise
        return _events_frame(fns, runs, warmup, f"{chosen} failed: {type(e).__name__}: {e}")
    rows = []
    for _, r in raw.iterrows():
        ns = 1e-6
        rows.append({
            "label": r["Annotation"], "backend": chosen, "n": int(r.get("NumRuns", runs)),
            "median_ms": math.nan, "p10_ms": math.nan, "p90_ms": math.nan,
            "mean_ms": float(r["AvgValue"]) * ns, "min_ms": float(r["MinValue"]) * ns,
            "max_ms": float(r["MaxValue"]) * ns
        })
    df = pd.DataFrame(rows, columns=NSIGHT_COLUMNS)
    df.attrs["backend"] = chosen
    df.attrs["reason"] = reason
    return df


def nsight_session(fns: Mapping[str, Callable[[], object]], *, runs: int, warmup: int, tool: str,
                   per_kernel: list | None = None):
    """One nsight-python session (``tool``: "cupti" or "ncu") over labelled eager functions, one
    annotated region each, ``runs`` times; returns nsight's processed DataFrame (one row per label,
    kernels summed).

    ``per_kernel``: a list that receives ``(label, kernel name, duration in ns)`` for every kernel
    nsight attributed, in launch order. nsight-python sums the kernels of a region before it
    returns, so the per-kernel records are read where it aggregates them
    (``nsight.extraction.extract_df_from_data``, which both its CUPTI and its NCU collectors call),
    without changing what it computes.
    """
    import tempfile

    import nsight
    import nsight.extraction as extraction

    for fn in fns.values():  # warm-up outside the profiler (module load, autotune)
        for _ in range(warmup):
            fn()
    original = extraction.extract_df_from_data

    def spy(profiling_data, *args, **kwargs):
        if per_kernel is not None:
            for label, records in profiling_data.items():
                for rec in records:
                    value = None if rec.values is None else float(rec.values[0])
                    per_kernel.append((label, rec.name, value))
        return original(profiling_data, *args, **kwargs)

    extraction.extract_df_from_data = spy
    try:
        nsight.activate(nsight.Tool.CUPTI if tool == "cupti" else nsight.Tool.NCU)
        with tempfile.TemporaryDirectory() as tmp:

            @nsight.analyze.kernel(configs=[(0,)], runs=runs, output_prefix=tmp + "/",
                                   combine_kernel_metrics=lambda a, b: a + b, thermal_mode="off")
            def bench(_unused):
                for label, fn in fns.items():
                    with nsight.annotate(label):
                        fn()

            return bench().to_dataframe()
    finally:
        extraction.extract_df_from_data = original
        if tool == "cupti":  # release CUPTI so torch.profiler (Kineto) can use it afterwards
            try:
                nsight.deactivate()
            except Exception:  # noqa: BLE001
                pass
