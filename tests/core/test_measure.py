"""sglab.core on the CPU: timing statistics, static kernel counting over a fake driver, NVML tables
over a fake NVML."""

import os
from collections import Counter
from types import SimpleNamespace

import pytest

from sglab.core import kernels, memory, timing


# -- timing
# -----------------------------------------------------------------------------------------------
def test_timing_summary_and_rows():
    t = timing.Timing([5.0, 1.0, 3.0, 2.0, 4.0])
    assert t.n == 5 and t.median_ms == 3.0
    assert t.p10_ms == pytest.approx(1.4) and t.p90_ms == pytest.approx(4.6)
    rows = t.rows(variant="after", tokens=16)
    assert [r["metric"] for r in rows] == ["time_median", "time_p10", "time_p90"]
    assert all(r["unit"] == "ms" and r["variant"] == "after" and r["tokens"] == 16 for r in rows)


def test_host_time_warms_up_then_repeats():
    calls = []
    t = timing.host_time(lambda: calls.append(1), warmup=3, repeat=7)
    assert len(calls) == 10 and t.n == 7 and t.clock.startswith("host")
    with pytest.raises(ValueError):
        timing.host_time(lambda: None, repeat=0)


def test_cuda_time_refuses_without_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        timing.cuda_time(lambda: None)


# -- static kernel counting through a fake cuda-bindings driver
# ---------------------------------------------
class FakeDriver:
    """Graphs are lists of nodes; a node is ("kernel", name) or ("graph", [child nodes]) or
    ("memset",)."""

    class CUgraph:

        def __init__(self, ptr):
            self.ptr = ptr

    def __init__(self, graphs, fail=None):
        self.graphs = graphs  # ptr -> list of nodes
        self.fail = fail

    def _nodes(self, g):
        return self.graphs[g.ptr] if isinstance(g, FakeDriver.CUgraph) else g

    def cuGraphGetNodes(self, g, n):
        if self.fail == "getnodes":
            return (1, None, 0)
        nodes = self._nodes(g)
        return (0, [] if n == 0 else list(nodes[:n]), len(nodes))

    def cuGraphNodeGetType(self, node):
        return (0, {"kernel": 0, "graph": 4, "memset": 2, "memcpy": 1}[node[0]])

    def cuGraphKernelNodeGetParams(self, node):
        return (0, SimpleNamespace(func=node[1]))

    def cuFuncGetName(self, func):
        return (0, func.encode())

    def cuGraphChildGraphNodeGetGraph(self, node):
        return (0, node[1])


class FakeGraph:

    def __init__(self, ptr):
        self.ptr = ptr

    def raw_cuda_graph(self):
        return self.ptr


@pytest.mark.parametrize("n", [1, 8, 32])
def test_counts_exactly_n_kernel_nodes(n):
    drv = FakeDriver({7: [("kernel", "index_kernel")] * n})
    out = kernels.graph_kernel_nodes(FakeGraph(7), driver=drv)
    assert out.kernels == n and out.names == ["index_kernel"] * n


def test_recurses_into_child_graphs():
    child = [("kernel", "gather"), ("memset",), ("kernel", "cast")]
    drv = FakeDriver({
        1: [("kernel", "gemm"), ("graph", child), ("memcpy",), ("graph", [("graph", child)])]
    })
    out = kernels.graph_kernel_nodes(FakeGraph(1), driver=drv)
    assert out.kernels == 5 and Counter(out.names) == {"gemm": 1, "gather": 2, "cast": 2}


def test_driver_error_is_raised_with_its_code():
    drv = FakeDriver({1: []}, fail="getnodes")
    with pytest.raises(RuntimeError, match="cuGraphGetNodes.*CUresult 1"):
        kernels.graph_kernel_nodes(FakeGraph(1), driver=drv)


def test_nsight_backend_on_this_machine_is_explained():
    backend, why = kernels.nsight_backend()
    assert backend in {"cupti", "ncu", "torch-profiler"} and why


# -- NVML tables through a fake NVML
# ------------------------------------------------------------------------
class FakeNVML:

    def __init__(self, per_gpu):
        self.per_gpu = per_gpu  # list (per GPU) of {pid: bytes}

    def nvmlDeviceGetCount(self):
        return len(self.per_gpu)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return b"Fake H200"

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in self.per_gpu[h].items()]


def test_process_memory_filters_pids_and_defaults_to_self():
    me = os.getpid()
    nv = FakeNVML([{me: 520 * 2**20, 11: 2**30}, {me: 100 * 2**20, 12: 5 * 2**20}])
    df = memory.process_gpu_memory(nvml=nv)
    assert list(df.columns) == memory.COLUMNS
    assert sorted(zip(df.gpu, df.used_mib)) == [(0, 520.0), (1, 100.0)]
    df2 = memory.process_gpu_memory([11, 12], nvml=nv)
    assert set(df2.pid) == {11, 12}


def test_no_match_is_an_empty_frame():
    nv = FakeNVML([{4242: 2**20}])
    assert memory.process_gpu_memory([1], nvml=nv).empty


def test_interleaved_alternates_variants_and_pools_samples():
    order = []
    fns = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    out = timing.interleaved(
        fns, rounds=3, warmup=2, repeat=9, timer=lambda fn, warmup, repeat: timing.host_time(
            fn, warmup=warmup, repeat=repeat, sync=False))
    assert {k: v.n for k, v in out.items()} == {"a": 9, "b": 9}
    # warm-up (2) + 3 samples of a, then b, then a again: the variants alternate round by round
    assert order == ["a"] * 5 + ["b"] * 5 + ["a"] * 3 + ["b"] * 3 + ["a"] * 3 + ["b"] * 3
    assert "3 interleaved rounds" in out["a"].clock
    with pytest.raises(ValueError):
        timing.interleaved({}, rounds=3)


# -- the NVML sampler over a scripted fake NVML
# --------------------------------------------------------------------
class ScriptedNVML(FakeNVML):
    """GPU lists that change with the number of reads: ``script(n)`` -> per-GPU {pid: bytes} for
    read n."""

    def __init__(self, script, n_gpus=2):
        super().__init__([{} for _ in range(n_gpus)])
        self.script, self.reads = script, 0

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        if h == 0:
            self.reads += 1
        self.per_gpu = self.script(self.reads)
        return super().nvmlDeviceGetComputeRunningProcesses(h)


def _context_appears(n):
    """pid 11: nothing, then a 520 MiB context on GPU 0 from read 5, grown to 612 MiB from read 10;
    pid 12 always holds 100 MiB on GPU 1."""
    gpu0 = {} if n < 5 else {11: (520 if n < 10 else 612) * 2**20}
    return [gpu0, {12: 100 * 2**20}]


def test_sampler_follows_processes_over_time():
    import time as _time

    with memory.Sampler(hz=200, nvml=ScriptedNVML(_context_appears)) as s:
        _time.sleep(0.25)
    assert len(s.ticks) >= 20 and s.errors == 0
    assert 100 <= s.achieved_hz() <= 260  # paced at 200 Hz, not as fast as it can
    df = s.samples()
    assert list(df.columns) == memory.SAMPLE_COLUMNS
    assert set(df[df.pid == 11].used_mib) == {520.0, 612.0} and set(df[df.pid == 12].gpu) == {1}
    steps = memory.step_series(df, s.ticks, pids=[11])
    # first tick, the two changes, the last tick
    assert list(steps.used_mib) == [0.0, 520.0, 612.0, 612.0]
    assert (steps.t.tolist() == sorted(steps.t) and steps.t.iloc[1] == s.ticks[4]
            and steps.t.iloc[2] == s.ticks[9])
    window = s.ticks[6:8]  # a window inside the 520 MiB stretch: one value, first and last tick
    assert list(memory.step_series(df, window, pids=[11]).used_mib) == [520.0, 520.0]


def test_sampler_survives_failed_reads_and_bad_rates():
    calls = {"n": 0}

    def flaky(n):
        calls["n"] += 1
        if calls["n"] % 3 == 0:
            raise RuntimeError("NVML_ERROR_NOT_FOUND: a process exited mid-read")
        return [{11: 2**20}]

    s = memory.Sampler(hz=500, nvml=ScriptedNVML(flaky, n_gpus=1)).start()
    import time as _time

    _time.sleep(0.1)
    s.stop()
    assert s.errors > 0 and len(s.ticks) > 0  # failed reads are counted, the series goes on
    with pytest.raises(ValueError):
        memory.Sampler(hz=0)
    with pytest.raises(RuntimeError, match="started once"):
        s.start()
    assert memory.step_series(s.samples().iloc[0:0], [], pids=[1]).empty
