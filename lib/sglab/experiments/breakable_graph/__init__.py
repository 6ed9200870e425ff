"""Notebook 03: one breakable CUDA graph for prefill batches of any request count (SGLang #24662).

- :mod:`.routing` (CPU): batches, a seeded mixed prefill stream and the graph hit rate of a runner's ``can_run``;
  ``layer_model`` resolution on four model shapes.
- :mod:`.run` (one GPU): parts a–e (see there); :mod:`.profile` is its traced pass.
- :mod:`.structure` (CPU): the segments and breaks one capture produces, recorded through the real
  ``eager_on_graph`` path (the slide's picture).
- :mod:`.analysis` (tables), :mod:`.figures` (every plot), :mod:`.claims` (what every run must show).
"""

from sglab.experiments.breakable_graph.analysis import (
    bs3_table,
    gpu_short,
    hit_rate_line,
    hit_rates,
    latency_table,
    launch_line,
    launch_table,
    match_table,
    multi_request_speedups,
    newest_per_gpu,
    segment_table,
    speedup_lines,
    spread,
)
from sglab.experiments.breakable_graph.routing import (
    graph_hit_rate,
    hit_rate_rows,
    hit_table,
    module_path,
    prefill_stream,
    resolution_rows,
    resolution_table,
    resolve_with_warnings,
    split_tokens,
    three_requests,
)
from sglab.experiments.breakable_graph.run import DEFAULT_PARAMS, EXPERIMENT, METHOD_VERSION, PARTS, _run, model_config, run

GPUS = 1

__all__ = [
    "DEFAULT_PARAMS", "EXPERIMENT", "GPUS", "METHOD_VERSION", "PARTS", "bs3_table", "gpu_short", "graph_hit_rate",
    "hit_rate_line", "hit_rate_rows", "hit_rates", "hit_table", "launch_line", "latency_table", "launch_table", "match_table", "model_config", "module_path",
    "multi_request_speedups", "newest_per_gpu", "prefill_stream", "resolution_rows", "resolution_table",
    "resolve_with_warnings", "run", "segment_table", "speedup_lines", "split_tokens", "spread", "three_requests",
]
