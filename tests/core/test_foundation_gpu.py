"""The foundation on real GPUs: static kernel-node counts (the canary), the profiler's count of one
replay, CUDA-event timing, NVML seeing this process, and multi-rank NCCL runs that never hang."""

import multiprocessing as mp
import os
import time

import pytest

from sglab.core import dist, hardware
from sglab.core import kernels, memory, timing

from tests.core import dist_fns


pytestmark = pytest.mark.gpu


def _index_kernels(n):
    import torch

    src = torch.arange(1024, device="cuda", dtype=torch.float32)
    idx = torch.randint(0, 1024, (256,), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(0))
    out = torch.empty(256, device="cuda")

    def step():
        for _ in range(n):
            torch.index_select(src, 0, idx, out=out)

    return step


def _capture(fn):
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(g):
        fn()
    g.instantiate()
    torch.cuda.synchronize()
    return g


@pytest.mark.parametrize("n", [1, 8, 32])
def test_canary_static_count_matches_profiler(n):
    g = _capture(_index_kernels(n))
    nodes = kernels.graph_kernel_nodes(g)
    assert nodes.kernels == n, nodes
    # one kernel, n times
    assert len(set(nodes.names)) == 1 and "kernel" in nodes.names[0], nodes.names
    seen = kernels.profiled_kernels(lambda: g.replay())
    assert len(seen) == n, seen


def test_cuda_time_reports_spread():
    import torch

    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    t = timing.cuda_time(lambda: a @ a, warmup=5, repeat=30)
    assert t.n == 30 and 0 < t.p10_ms <= t.median_ms <= t.p90_ms


def test_nvml_sees_this_process():
    import torch

    x = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda:0")  # 256 MiB on GPU 0
    torch.cuda.synchronize()
    df = memory.process_gpu_memory()
    assert not df.empty, f"NVML lists none of pid {os.getpid()}: {memory.all_processes()}"
    assert df[df.gpu == 0].used_mib.sum() >= 256
    del x


@pytest.mark.gpus(2)
def test_nccl_all_reduce_on_two_ranks():
    out = dist.launch(dist_fns.all_reduce_sum, 2, timeout_s=180, collective_timeout_s=60)
    assert [rows[0]["sum"] for rows in out] == [3.0, 3.0]
    assert [rows[0]["device"] for rows in out] == ["cuda:0", "cuda:1"]
    assert mp.active_children() == []


@pytest.mark.gpus(1)
def test_nccl_ranks_fork_from_a_server_that_imported_torch_and_the_measurements():
    """05 and 06 fork their ranks from a server that imported torch and their measurement modules
    (:func:`sglab.core.dist.forkserver`): those imports initialise no CUDA, so each fork opens its
    own GPU and joins NCCL. One rank per GPU, up to two."""
    from sglab.capture_sizes import measure as sizes
    from sglab.grid_thw import measure as grid

    world = min(2, hardware.gpu_count())
    dist.forkserver((*sizes.FORKSERVER_PRELOAD, *grid.FORKSERVER_PRELOAD[1:]))
    try:
        out = dist.launch(dist_fns.all_reduce_sum, world, timeout_s=180, collective_timeout_s=60,
                          start_method="forkserver")
    finally:
        dist.stop_forkserver()
    assert [rows[0]["sum"] for rows in out] == [float(sum(range(1, world + 1)))] * world
    assert [rows[0]["device"] for rows in out] == [f"cuda:{r}" for r in range(world)]
    assert len({rows[0]["pid"] for rows in out} | {os.getpid()}) == world + 1
    assert mp.active_children() == []


@pytest.mark.gpus(2)
def test_nccl_rank_that_never_joins_fails_with_timeout_and_leaves_nothing():
    # Rank 1 stays alive but never enters the all-reduce rank 0 is blocked in. Whichever limit fires
    # first — the NCCL watchdog (collective_timeout_s) or the launcher's deadline (timeout_s) — the
    # caller gets a DistTimeout naming the stuck rank within the run limit (plus the seconds it
    # takes to kill), not a hang.
    run_limit = 45
    t0 = time.monotonic()
    with pytest.raises(dist.DistTimeout) as ei:
        dist.launch(dist_fns.rank_1_never_joins, 2, args=(600,), timeout_s=run_limit,
                    collective_timeout_s=15)
    elapsed = time.monotonic() - t0
    assert elapsed < run_limit + 15, elapsed
    assert "rank 0" in str(ei.value)
    assert mp.active_children() == []
    time.sleep(2)  # the driver releases a killed process's contexts asynchronously
    others = {r["pid"] for r in memory.all_processes()} - {os.getpid()}
    assert others == set(), f"processes still holding GPU memory: {others}"
    print(f"never-join failed after {elapsed:.1f} s: {str(ei.value).splitlines()[0]}")


def test_hardware_inventory_matches_torch():
    import torch

    assert hardware.gpu_count() == torch.cuda.device_count()
    assert all(g.uuid for g in hardware.gpus())
