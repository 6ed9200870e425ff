"""GPU tests (2 GPUs): a cuda:0 grid makes rank 1 open a context on GPU 0; the CPU grid does not;
the concurrent run holds every claim (memory time series included); nothing is left running."""

import multiprocessing as mp
import os

import pytest

from sglab.core import claims, hardware, runs
from sglab.grid_thw import claims as grid_claims
from sglab.grid_thw import measure


pytestmark = [
    pytest.mark.skipif(not hardware.meets(2)[0], reason="needs 2 CUDA GPUs"), pytest.mark.gpu,
    pytest.mark.gpus(2)
]


def _gpu0_mib(rows, rank, phase):
    return sum(r["value"] for r in rows if r["metric"] == "gpu_memory" and r["rank"] == rank
               and r["gpu"] == 0 and r["phase"] == phase)


def _value(rows, metric, rank=-1):
    (v,) = [r["value"] for r in rows if r["metric"] == metric and r["rank"] == rank]
    return v


@pytest.mark.parametrize("variant", ["before", "ipc"])
def test_cuda0_grid_opens_a_context_on_gpu0(variant):
    rows = measure.run_group(variant, 2)["rows"]
    assert _value(rows, "grid_device", 1) == 0  # rank 1's grid landed on cuda:0
    assert _value(rows, "pixel_values_device", 1) == -1  # the feature itself was offloaded
    assert _gpu0_mib(rows, 1, "init") == 0
    assert _gpu0_mib(rows, 1, "received") > 100  # a whole CUDA context, not 32 bytes
    assert _gpu0_mib(rows, 1, "kernel") >= _gpu0_mib(rows, 1, "received")
    assert _value(rows, "processes_alive") == 0
    assert _value(rows, "nvml_processes_listed") == 0


def test_cpu_grid_leaves_gpu0_alone():
    rows = measure.run_group("after", 2)["rows"]
    assert _value(rows, "grid_device", 1) == -1
    assert _value(rows, "grid_key_is_image_grid_thw", 1) == 1
    for phase in measure.PHASES:
        assert _gpu0_mib(rows, 1, phase) == 0
    assert _value(rows, "processes_alive") == 0
    assert _value(rows, "nvml_processes_listed") == 0


def test_concurrent_run_holds_every_claim_and_leaves_nothing(tmp_path):
    out = measure.run({"repeats": 1}, progress=False)
    path = runs.write_run(out.df, experiment=measure.EXPERIMENT,
                          method_version=measure.METHOD_VERSION,
                          params={**measure.DEFAULT_PARAMS, "repeats": 1
                                  }, root=tmp_path, gpu_count=2, sidecars=out.sidecars)
    run = runs.read_run(path)
    results = {r.claim.id: r.outcome for r in claims.evaluate(grid_claims, run)}
    failed = {k: o.reason or o.measured for k, o in results.items() if o.status == claims.FAIL}
    assert not failed, failed
    for cid in ("grid_thw.concurrent.no_mixing", "grid_thw.series.rate",
                "grid_thw.series.context_at_unpickle", "grid_thw.series.growth_step",
                "grid_thw.eager.no_growth"):
        assert results[cid].status == claims.PASS, (cid, results[cid])
    mem = run.sidecar("memory")
    assert set(mem.variant) >= {"before", "after"} and len(mem) < 20000  # change points only
    assert mp.active_children() == []
    me = os.getpid()
    assert not [
        p
        for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == me and _is_python(int(p))
    ]


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _is_python(pid: int) -> bool:
    """A child interpreter (the fork server or a rank); the resource tracker is expected to stay."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return "python" in cmd and "resource_tracker" not in cmd
