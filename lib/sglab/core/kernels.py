"""Count and time the kernels of GPU work: statically (a captured CUDA graph's kernel nodes through
cuda-bindings, child graphs included), through torch.profiler (:mod:`sglab.core.trace`), and
through nsight-python where it can run (:func:`nsight_backend` decides)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Callable

from sglab.core import trace
from sglab.core.trace import _warm_profiler  # noqa: F401 - workspace_floor imports it from here


KERNEL, CHILD_GRAPH = 0, 4  # CUgraphNodeType values (stable across CUDA 12/13)


@dataclass
class GraphNodes:
    """The kernel nodes of a captured graph: their names, when the driver gives them."""

    names: list[str] = field(default_factory=list)

    @property
    def kernels(self) -> int:
        return len(self.names)


def _check(result, what: str):
    """cuda-bindings returns (CUresult, *values); raise on an error code, return the values."""
    err, *values = result
    if int(err) != 0:
        raise RuntimeError(f"{what} failed with CUresult {int(err)} ({err!r})")
    return values[0] if len(values) == 1 else values


def _walk(driver, graph, out: GraphNodes, depth: int = 0) -> None:
    if depth > 16:
        raise RuntimeError("child graphs nested deeper than 16 levels")
    _, n = _check(driver.cuGraphGetNodes(graph, 0), "cuGraphGetNodes(count)")
    if int(n) == 0:
        return
    nodes, _ = _check(driver.cuGraphGetNodes(graph, int(n)), "cuGraphGetNodes")
    for node in nodes[:int(n)]:
        t = _check(driver.cuGraphNodeGetType(node), "cuGraphNodeGetType")
        code = int(getattr(t, "value", t))
        if code == KERNEL:
            name = "<unnamed>"
            with suppress(Exception):
                params = _check(driver.cuGraphKernelNodeGetParams(node),
                                "cuGraphKernelNodeGetParams")
                name = _check(driver.cuFuncGetName(params.func), "cuFuncGetName")
            out.names.append(name.decode() if isinstance(name, bytes) else str(name))
        elif code == CHILD_GRAPH:
            child = _check(driver.cuGraphChildGraphNodeGetGraph(node),
                           "cuGraphChildGraphNodeGetGraph")
            _walk(driver, child, out, depth + 1)


def graph_kernel_nodes(graph, *, driver=None) -> GraphNodes:
    """The kernel nodes of a captured graph (or ``cudaGraph_t`` address), child graphs included."""
    if driver is None:
        try:
            from cuda.bindings import driver
        except ImportError as e:  # pragma: no cover - where cuda-bindings is missing
            raise RuntimeError("static kernel counting needs cuda-bindings (pip install "
                               "'sglab[gpu]' or cuda-bindings)") from e
    raw = graph.raw_cuda_graph() if hasattr(graph, "raw_cuda_graph") else graph
    out = GraphNodes()
    _walk(driver, driver.CUgraph(int(raw)) if isinstance(raw, int) else raw, out)
    return out


def profiled_kernels(fn: Callable[[], object]) -> list[str]:
    """The kernels torch.profiler records in one call of ``fn`` (memcpy/memset aside), in order."""
    with trace.Recorder(cuda=True) as rec:
        fn()
    return list(rec.events.name[rec.events.category == "kernel"])


# -- nsight-python ---------------------------------------------------------------------------------
NCU_MIN_VERSION = (2026, 2, 1)


def nsight_backend() -> tuple[str, str]:
    """``(tool, why)``: "cupti" or "ncu" (nsight-python's collector), else "torch-profiler"."""
    os.environ.setdefault("NSPY_NCU_INIT_AT_IMPORT", "0")  # else importing nsight loads ncu
    try:
        import nsight
    except ImportError as e:
        return "torch-profiler", f"nsight-python is not installed ({e})"
    try:
        from nsight.collection import cupti

        if getattr(cupti, "CUPTI_AVAILABLE", False):
            return "cupti", f"nsight-python {getattr(nsight, '__version__', '?')} with CUPTI"
        cupti_reason = "cupti-python is not importable"
    except Exception as e:  # noqa: BLE001
        cupti_reason = f"CUPTI unavailable ({type(e).__name__}: {e})"
    path, text = shutil.which("ncu"), ""
    with suppress(Exception):
        text = subprocess.run([path, "--version"], capture_output=True, text=True,
                              timeout=30).stdout if path else ""
    m = re.search(r"(\d{4})\.(\d+)\.(\d+)", text)  # Nsight Compute's version, e.g. 2025.3.1
    v = tuple(int(x) for x in m.groups()) if m else ()
    version, newer = ".".join(map(str, v)), ".".join(map(str, NCU_MIN_VERSION))
    if v >= NCU_MIN_VERSION:
        return "ncu", f"{cupti_reason}; nsight-python with Nsight Compute {version}"
    return "torch-profiler", f"{cupti_reason}; " + (f"ncu {version} is older than {newer}"
                                                    if v else "no ncu on PATH")


@contextmanager
def nsight_session(tool: str = "cupti"):
    """nsight-python with ``tool`` active: ``profile(body, runs)`` -> every kernel it saw."""
    import nsight
    import nsight.extraction as extraction

    original = extraction.extract_df_from_data

    def profile(body: Callable[[], object], runs: int) -> list[tuple]:
        records: list = []

        def spy(profiling_data, *args, **kwargs):
            records.extend((label, r.name, None if r.values is None else float(r.values[0]))
                           for label, rs in profiling_data.items() for r in rs)
            return original(profiling_data, *args, **kwargs)

        extraction.extract_df_from_data = spy
        try:
            with tempfile.TemporaryDirectory() as tmp:

                @nsight.analyze.kernel(configs=[(0,)], runs=runs, output_prefix=tmp + "/",
                                       combine_kernel_metrics=lambda a, b: a + b,
                                       thermal_mode="off", verbosity=nsight.VerbosityLevel.SILENT)
                def bench(_unused):
                    body()

                bench()
        finally:
            extraction.extract_df_from_data = original
        return records

    nsight.activate(nsight.Tool.CUPTI if tool == "cupti" else nsight.Tool.NCU)
    try:
        yield profile
    finally:
        if tool == "cupti":  # release CUPTI so torch.profiler (Kineto) can use it afterwards
            with suppress(Exception):
                nsight.deactivate()
