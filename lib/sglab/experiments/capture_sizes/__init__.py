"""Capture the dense-TP1 layer boundary over piecewise capture sizes, before and after SGLang PR #23972.

The rebuild (:mod:`sglab.fixes.capture_sizes`) has the default sizes, the PR's ``mul_base`` filter, today's
round-up and the ``tensor_split`` + reduce-scatter boundary. This package measures it:

- :mod:`.run`: one rank per GPU (NCCL; gloo on the CPU for tests) runs the piecewise runner's capture loop over
  each variant's size list, replays every captured bucket with padded real token counts, probes the collective
  on the raw sizes without the shard check, then a separate traced pass (:mod:`.profile`);
- :mod:`.analysis`: tables from a run (per variant, per size, per traced capture range) and the CPU tables of
  the rebuild (which sizes survive, the alignment bases, the design-review findings);
- :mod:`.figures`: the mechanism picture (sizes split over the attention-TP ranks), the per-size status, the
  alignment heatmaps and the profiler timeline;
- :mod:`.claims`: what every run must show.

Variants of the live run: ``before`` (the PR-era list, unfiltered), ``before_probe`` (each raw size on its own,
eager, without the shard check), ``pr_filter`` (the PR's filter) and ``round_up`` (sizes rounded up to
``mul_base``, as SGLang does today).
"""

from __future__ import annotations

EXPERIMENT = "capture_sizes"
# 1: capture loop, replay check and probe rows. 2: the same rows, plus per-phase wall times and a traced pass of the
# capture loop (before: the raw list; after: the PR's list) stored as the `events` and `trace` sidecars.
METHOD_VERSION = 2
GPUS = 2
DEFAULT_PARAMS = {
    "world_size": 2,        # ranks = attention-TP group size (one GPU each)
    "sizes": "scaled",      # "scaled": default list x world_size/8 (the tp-8 failures); "default": as is
    "max_tokens": 2048,     # piecewise_cuda_graph_max_tokens (2048 = the MLA default)
    "hidden": 1024,
    "dtype": "bfloat16",
    "seed": 0,
    "backend": "nccl",      # "gloo" runs the same logic on the CPU (no graphs) for tests
    "timeout_s": 420,       # the whole multi-rank run
    "collective_timeout_s": 60,
    "profile": True,        # a separate traced pass of the capture loop (the `events` and `trace` sidecars)
}
VARIANTS = ("before", "before_probe", "pr_filter", "round_up")
TOL = 1e-4  # max abs error accepted per replay (float32 per-token op on exact integer sums; measured: 0)

from sglab.experiments.capture_sizes.analysis import (  # noqa: E402
    alignment_summary, alignment_table, capture_ranges, describe_run, newest_per_world_size, padding_waste,
    policy_lists, review_table, rule_table, run_facts, runs_table, size_status, size_table, summary, trace_summary,
)
from sglab.experiments.capture_sizes.run import (  # noqa: E402
    _merge, _probe_is_safe, loop_order, raw_sizes, replay_token_counts, run, scaled_default_sizes, size_lists,
)

__all__ = [
    "EXPERIMENT", "METHOD_VERSION", "GPUS", "DEFAULT_PARAMS", "VARIANTS", "TOL", "run", "raw_sizes", "size_lists",
    "scaled_default_sizes", "loop_order", "padding_waste", "replay_token_counts", "summary", "run_facts", "runs_table", "newest_per_world_size", "size_status",
    "capture_ranges", "trace_summary", "describe_run", "size_table", "policy_lists", "alignment_table",
    "alignment_summary", "review_table", "rule_table",
]
