"""The measurement's CPU path: the rows of every method-3 run (the gate, timings, the host's
per-launch cost, launch counts), the bf16 tolerance, the counting pass and the launch burst."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from sglab.core import timing
from sglab.core.toy_decoder import DecoderConfig
from sglab.pcg_gate import measure, rebuild, tables


TINY = {
    "hidden": 64, "num_layers": 3, "num_heads": 4, "intermediate": 96, "vocab": 50,
    "max_tokens": 256, "token_counts": [16, 100, 256], "repeat": 2, "rounds": 1, "warmup": 1,
    "trace_token_counts": [16, 256], "direct_token_counts": [], "launch_burst": 8
}


def host_timer(f, warmup, repeat):
    return timing.host_time(f, warmup=warmup, repeat=repeat)


@pytest.fixture(scope="module")
def cpu_run():
    return measure.sweep({**measure.DEFAULT_PARAMS, **TINY}, torch.device("cpu"), use_graphs=False,
                         timer=host_timer)


def test_the_measured_model_is_the_one_measured_before():
    """The same LLM as every recorded run: outputs computed before the decoder was shared."""
    cfg = DecoderConfig(vocab_size=50, hidden_size=64, num_layers=3, num_heads=4,
                        intermediate_size=96, max_position=256, positions="rotary")
    lm = measure.language_model(cfg, torch.device("cpu"), torch.float32, seed=0)
    with torch.no_grad():
        out = lm.model(torch.arange(37) % 50, torch.arange(37))
    assert out.shape == (37, 64)
    assert out.sum().item() == pytest.approx(36.42622375488281, rel=1e-4)
    assert out.abs().sum().item() == pytest.approx(1896.431396484375, rel=1e-5)
    torch.testing.assert_close(
        out[:2, :3].flatten(),
        torch.tensor([-1.033568, 0.197706, -0.144566, 1.119492, 0.907668, 0.898351]), atol=1e-5,
        rtol=1e-4)


def test_bf16_tolerance():
    assert measure.bf16_ulp(1.0) == 2**-7
    assert measure.bf16_ulp(5.3) == 2**-5
    assert measure.compare(torch.zeros(1), torch.tensor([5.3]))["tolerance"] == 0.25


def test_run_rows_on_cpu(cpu_run):
    df = cpu_run.df
    assert list(df.columns) == [
        "experiment", "variant", "num_tokens", "bucket", "metric", "value", "unit"
    ]
    facts = tables.run_facts(df)
    assert facts[("eager", "gate_enabled")] == 0.0 and facts[("piecewise", "gate_enabled")] == 1.0
    assert facts[("piecewise", "buckets")] == len(rebuild.piecewise_cuda_graph_tokens(256))
    t = tables.latency_table(df)
    assert list(t.index) == [16, 100, 256] and list(t["bucket"]) == [16, 112, 256]
    assert t["within_tol"].all() and (t["max_abs_diff_same_shape"] == 0).all()
    assert (t["speedup"] > 0).all()
    assert set(cpu_run.sidecars) == {"events"}  # no Perfetto file, no kernel table on the CPU


def test_method_3_rows_at_every_timed_count(cpu_run):
    """The host's per-launch cost (time.perf_counter; no CUDA-event clock on the CPU) and the
    counting pass's launches and device time, per timed token count."""
    d = cpu_run.df
    host = d[d.variant == measure.HOST]
    assert set(host.metric) == {"launch_us", "launch_us_p10", "launch_us_p90"}
    for n in TINY["token_counts"]:
        h = host[host.num_tokens == n].set_index("metric").value
        assert 0 < h["launch_us_p10"] <= h["launch_us"] <= h["launch_us_p90"]
        counted = d[(d.num_tokens == n) & d.metric.isin(["launches", "device_us"])]
        assert set(zip(counted.variant, counted.metric)) == {(v, m)
                                                             for v in ("eager", "piecewise")
                                                             for m in ("launches", "device_us")}
    assert measure.METHOD_VERSION == 3


def test_the_burst_drops_its_warmup_and_reports_both_clocks():
    burst = measure.Burst("cpu", 4)
    for _ in range(5):
        burst()
    assert len(burst.host_ms) == 5
    burst.host_ms[:] = [9.0, 0.004, 0.008, 0.012, 0.016]  # the first call: a warm-up
    events = timing.Timing([0.008, 0.008], clock="cuda-events, 3 interleaved rounds")
    rows = {r["metric"]: r["value"] for r in burst.rows(events, warmup=1, n=64, bucket=64)}
    assert rows["launch_us"] == pytest.approx(2.5)  # median 0.010 ms over 4 launches
    assert rows["launch_event_us"] == pytest.approx(2.0)
    assert rows["launch_us_p10"] < rows["launch_us"] < rows["launch_us_p90"] < 9.0 * 1e3 / 4
    host_only = burst.rows(timing.Timing([0.01], clock="host-perf-counter+sync"), warmup=1)
    assert {r["metric"] for r in host_only} == {"launch_us", "launch_us_p10", "launch_us_p90"}


def test_the_counting_pass_counts_launch_calls_and_device_time():
    """Kernel and graph launches and memcpy/memset calls count as launches; other runtime calls
    and host ops do not; device time sums kernels, memcpys and memsets."""
    runtime = [
        "cudaLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch", "cudaMemcpyAsync",
        "cudaStreamSynchronize", "cudaEventRecord"
    ]
    ev = pd.DataFrame([("runtime", name, "runtime", i, 1.0) for i, name in enumerate(runtime)] + [
        ("stream 7", "gemm", "kernel", 10, 5.0), ("stream 7", "Memcpy DtoD", "memcpy", 20, 1.5),
        ("host", "phase::eager 64", "range", 0, 30.0)
    ], columns=["lane", "name", "category", "start_us", "dur_us"])
    ev = ev.assign(variant="eager", num_tokens=64)
    rows = {r["metric"]: r["value"] for r in measure.trace_rows(ev, measure.COUNTED)}
    assert rows == {"launches": 4.0, "device_us": 6.5}


def test_bad_token_counts_are_refused():
    sizes = rebuild.piecewise_cuda_graph_tokens(256)
    with pytest.raises(ValueError, match="above the largest bucket"):
        measure.check_params({**measure.DEFAULT_PARAMS, "token_counts": [512]}, sizes)
    with pytest.raises(ValueError, match="subset of token_counts"):
        measure.check_params({**measure.DEFAULT_PARAMS, **TINY, "direct_token_counts": [64]}, sizes)
