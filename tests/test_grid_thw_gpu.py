"""GPU tests (2 GPUs): a cuda:0 grid makes rank 1 open a context on GPU 0; the CPU grid does not; nothing
is left running afterwards."""

import pytest

from sglab import hardware
from sglab.experiments import grid_thw as exp


def _gpu0_mib(rows, rank, phase):
    return sum(r["value"] for r in rows if r["metric"] == "gpu_memory" and r["rank"] == rank and r["gpu"] == 0
               and r["phase"] == phase)


def _value(rows, metric, rank=-1):
    (v,) = [r["value"] for r in rows if r["metric"] == metric and r["rank"] == rank]
    return v


@pytest.mark.skipif(not hardware.meets(2)[0], reason="needs 2 CUDA GPUs")
@pytest.mark.gpu
@pytest.mark.gpus(2)
@pytest.mark.parametrize("variant", ["before", "ipc"])
def test_cuda0_grid_opens_a_context_on_gpu0(variant):
    rows = exp.run_variant(variant, 2)
    assert _value(rows, "grid_device", 1) == 0           # rank 1's grid landed on cuda:0
    assert _value(rows, "pixel_values_device", 1) == -1  # the feature itself was offloaded
    assert _gpu0_mib(rows, 1, "init") == 0
    assert _gpu0_mib(rows, 1, "received") > 100          # a whole CUDA context, not 32 bytes
    assert _gpu0_mib(rows, 1, "kernel") >= _gpu0_mib(rows, 1, "received")
    assert _value(rows, "processes_alive") == 0
    assert _value(rows, "nvml_processes_listed") == 0


@pytest.mark.skipif(not hardware.meets(2)[0], reason="needs 2 CUDA GPUs")
@pytest.mark.gpu
@pytest.mark.gpus(2)
def test_cpu_grid_leaves_gpu0_alone():
    rows = exp.run_variant("after", 2)
    assert _value(rows, "grid_device", 1) == -1
    assert _value(rows, "grid_key_is_image_grid_thw", 1) == 1
    for phase in exp.PHASES:
        assert _gpu0_mib(rows, 1, phase) == 0
    assert _value(rows, "processes_alive") == 0
    assert _value(rows, "nvml_processes_listed") == 0
