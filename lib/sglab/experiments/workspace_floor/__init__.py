"""Allreduce-fusion workspace re-creations along a serving trace, per ``max_token_num`` policy (PR #26382 B).

- :mod:`.traces` - the seeded token-count traces (``data/traces/``);
- :mod:`.simulation` - the PR-era manager on a fake creator over the full traces: exact counts and sizes (CPU);
- :mod:`.run` - the same replay on 2 or 4 GPUs with real creations (CUDA IPC, gloo exchange, Lamport fill,
  barriers), a creation-cost sweep and a leak check; :mod:`.profile` - the traced pass;
- :mod:`.analysis` (tables), :mod:`.figures` (every figure, the slide's included), :mod:`.claims`.

Method versions: 1 - replay, cost sweep, leak check; 2 - the cost sweep alternates sizes in rounds
(``sglab.core.timing.interleaved``), the IPC handle export is timed apart from the exchange, per-phase wall
times go to the manifest, and a traced pass adds the ``events`` sidecar and one Perfetto file per rank.
"""

from sglab.fixes import workspace_floor as _wf

from sglab.experiments.workspace_floor.traces import (
    TRACE_DIR,
    TRACE_PARAMS,
    TRACE_PREFIX,
    TRACES,
    calls_over,
    generate_trace,
    load_trace,
    pcg_buckets,
    trace_params,
    trace_tokens,
    write_trace,
)

EXPERIMENT = "workspace_floor"
METHOD_VERSION = 2
GPUS = 2

DEFAULT_PARAMS = {
    "world_size": 2,
    "hidden_dim": 7168,  # Kimi-K2.5
    "policies": list(_wf.POLICIES),
    "pre_initialize": 0,  # the GPU replay: 0 = cold start (the first call creates); 2048 = SGLang's pre-init
    "gpu_trace_steps": 0,  # 0 = replay the whole trace on GPU
    # sizes where the creation cost is flat (64-2048 at W=2) and both sides of its step (Lamport 336 -> 672 MiB)
    "cost_tokens": [64, 1024, 2048, 4096, 8192, 16384],
    "cost_warmup": 1,
    "cost_repeats": 6,  # p10-p90 within ~15% of the median in the method-1 runs (7 repeats)
    "cost_rounds": 3,
    "creator": "ipc",  # "ipc" (this rebuild) or "flashinfer" (FlashInfer's own creation, where installed)
    "traces": list(TRACES),
    "profile": True,  # the traced pass (after the timed ones)
    "profile_trace": "short_ramp",
    "profile_policies": ["floor_0", "floor_2048"],
}

from sglab.experiments.workspace_floor import analysis, claims, figures, profile, simulation, text  # noqa: E402  (they read the names above)
from sglab.experiments.workspace_floor.analysis import (  # noqa: E402
    POLICY_ORDER,
    consistency_table,
    cost_frame,
    counts_table,
    gpu_policy_table,
    leak_table,
    newest_per_world,
    phase_table,
    policy_stats,
    repeatability_table,
    run_world_size,
)
from sglab.experiments.workspace_floor.run import gloo_rank_selftest, run  # noqa: E402
from sglab.experiments.workspace_floor.simulation import simulate_rows, simulated_frame  # noqa: E402

__all__ = [
    "DEFAULT_PARAMS", "EXPERIMENT", "GPUS", "METHOD_VERSION", "POLICY_ORDER", "TRACES", "TRACE_DIR", "TRACE_PARAMS",
    "TRACE_PREFIX", "analysis", "profile", "simulation", "text", "calls_over", "claims", "consistency_table", "cost_frame", "counts_table",
    "figures", "generate_trace", "gloo_rank_selftest", "gpu_policy_table", "leak_table", "load_trace",
    "newest_per_world", "pcg_buckets", "phase_table", "policy_stats", "repeatability_table", "run",
    "run_world_size", "simulate_rows", "simulated_frame", "trace_params", "trace_tokens", "write_trace",
]
