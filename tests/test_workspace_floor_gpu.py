"""GPU test: the real IPC workspace on 2 GPUs - counts match the simulation, memory goes back, no rank left."""

import pytest

from sglab import hardware
from sglab.experiments import workspace_floor as exp


@pytest.mark.skipif(not hardware.meets(2)[0], reason="needs 2 CUDA GPUs")
@pytest.mark.gpu
@pytest.mark.gpus(2)
def test_live_replay_matches_simulation_and_leaves_nothing():
    params = {"world_size": 2, "policies": ["floor_0", "floor_2048"], "cost_tokens": [64, 2048],
              "cost_warmup": 1, "cost_repeats": 2}
    df = exp.run(params, progress=False)
    rec = df[df.metric == "recreations"]
    sim = rec[(rec.source == "simulated") & (rec.scenario == "cold")].set_index(["trace", "variant"])["value"]
    gpu = rec[rec.source == "gpu"]
    assert len(gpu) == 2 * 2 * 2  # traces x policies x ranks
    for _, row in gpu.iterrows():
        assert row.value == sim[row.trace, row.variant]
    peak = df[(df.source == "gpu") & (df.metric.isin(["peak_workspace", "peak_workspace_measured"]))]
    for (_, _, _), g in peak.groupby(["trace", "variant", "rank"]):
        planned, measured = (g.set_index("metric")["value"][k] for k in ("peak_workspace", "peak_workspace_measured"))
        assert planned <= measured <= planned + 64  # + pointer table / allocator slack
    assert (df[df.metric == "mem_after_cleanup"].value.abs() < 1e-9).all()
    for m in ("rank_mem_delta_cudart", "rank_mem_delta_nvml"):
        assert (df[df.metric == m].value.abs() < 1e-9).all(), m
    assert df[df.metric == "rank_processes_left"].value.item() == 0
    assert df[df.metric == "gpu_mem_of_rank_pids_after"].value.item() == 0
