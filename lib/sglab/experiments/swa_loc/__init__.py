"""Decode-graph kernels, replay time and KV contents with and without the SWA-location preset (SGLang #23552,
follow-up #24743).

For each layer count and SWA:full ratio, three runners (``before``, ``pr23552``, ``pr24743``; see
:mod:`sglab.fixes.swa_loc`) capture one decode graph per batch size, each on its own identically built pool.
Per (variant, layers, batch size) the run has these rows:

- ``translate_calls_capture``: ``translate_loc_from_full_to_swa`` calls while the graph was being captured
  (Python counter);
- ``graph_kernel_nodes``: kernel nodes in the captured graph (static count through cuda-bindings);
- ``profiled_kernels``: kernels torch.profiler sees during one replay;
- ``kv_mismatch_slots``: (layer, slot) pairs where the pool after one populated replay differs from an
  eager reference that ran the same batch (padding slot 0 excluded; expected 0);
- ``time_median`` / ``time_p10`` / ``time_p90``: CUDA-event time of one replay, from
  :func:`sglab.core.timing.interleaved` (the variants alternate in rounds, samples pooled).

Then the #24743 padding scenario (:func:`pad_bug_scenario`) on real graphs for each variant:
``pad_corrupted_slots`` (layer, slot pairs that differ from the eager reference), ``pad_predicted_slots``
and ``pad_matches_prediction`` (1 when exactly the predicted slots, in every SWA layer and nowhere else).

Sidecars (method 2): ``events`` (torch.profiler events of one replay per variant at ``trace_config``) and ``trace``
(its Perfetto file), ``graph_kernels`` (the kernel nodes of those graphs by name) and ``eager_kernels`` (per-op
kernel table of one eager decode step before / after, from torch.profiler and nsight-python).

Method versions: 1 -- a private timing loop (``rounds`` x ``repeat`` samples per cell); 2 -- timing through
``interleaved`` (``repeat`` samples per cell in ``rounds`` rounds), the lean default sweep, and the sidecars.
"""

from __future__ import annotations

from typing import Any, Dict

from sglab.fixes import swa_loc as fx

EXPERIMENT = "swa_loc"
METHOD_VERSION = 2
GPUS = 1
HEADLINE_CONFIG = {"num_layers": 48, "swa_per_full": 5, "batch_size": 32}  # Gemma-3-like layout, mid-size batch
DEFAULT_PARAMS: Dict[str, Any] = {
    "layer_counts": [12, 48],
    "swa_per_full": [5, 1],  # Gemma-3-like 5 local : 1 global, and gpt-oss-like alternation
    "batch_sizes": [1, 32, 128],
    "variants": list(fx.VARIANTS),
    "size": 4096,
    "size_swa": 2048,
    "head_num": 8,
    "head_dim": 128,
    "dtype": "bfloat16",
    "warmup": 10,
    "repeat": 60,
    "rounds": 3,
    "pad_num_layers": 12,
    "trace_config": dict(HEADLINE_CONFIG),  # the layout and batch size of the traced replays
    "eager_config": {"num_layers": 12, "swa_per_full": 5, "batch_size": 32},  # the eager kernel table's step
    "kernel_table_runs": 3,
    "seed": 0,
}
# The sweep the method-1 runs recorded (4 layer counts x 4 batch sizes): PARAMS = FULL_SWEEP in the notebook or
# `sglab record swa_loc --param layer_counts=[6,12,24,48] --param batch_sizes=[1,8,32,128]`.
FULL_SWEEP: Dict[str, Any] = {**DEFAULT_PARAMS, "layer_counts": [6, 12, 24, 48], "batch_sizes": [1, 8, 32, 128],
                              "repeat": 150}

from sglab.experiments.swa_loc.analysis import (VARIANT_LABELS, kernel_counts, kernel_table, profiler_agreement,  # noqa: E402
                       short_gpu, time_table)
from sglab.experiments.swa_loc.run import kv_mismatch_count, make_batches, pad_bug_scenario, run, sweep  # noqa: E402

__all__ = ["EXPERIMENT", "METHOD_VERSION", "GPUS", "DEFAULT_PARAMS", "FULL_SWEEP", "HEADLINE_CONFIG", "run",
           "sweep", "pad_bug_scenario", "make_batches", "kv_mismatch_count", "kernel_counts", "kernel_table",
           "profiler_agreement", "time_table", "short_gpu", "VARIANT_LABELS"]
