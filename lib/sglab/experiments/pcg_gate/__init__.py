"""Notebook 01: what the piecewise-CUDA-graph gate buys a VLM wrapper that passes it (SGLang #26382 part A).

- :mod:`.variants` (CPU): the Kimi-shaped wrappers through the PR-era gate — decision, resolved layer stack,
  ``state_dict()`` keys, round trips — and what the ``__setattr__`` guard still lets through.
- :mod:`.run` (one GPU): eager prefill (the wrapper that fails the gate) vs piecewise-CUDA-graph prefill (the one
  that passes), per token count; :mod:`.profile` is its traced pass and per-kernel table.
- :mod:`.analysis` (tables), :mod:`.figures` (every plot, the slide's mechanism picture included),
  :mod:`.claims` (what every run must show).
"""

from sglab.core import runs as _runs
from sglab.experiments.pcg_gate.analysis import (
    buffer_copy_bytes,
    by_gpu,
    copy_explanation,
    correctness,
    gate_table,
    kernel_summary,
    latency_table,
    newest_per_gpu,
    reading,
    run_facts,
    run_summary,
    slowdown_start,
    speedup_threshold,
    trace_table,
)
from sglab.experiments.pcg_gate.run import (
    DEFAULT_PARAMS,
    EXPERIMENT,
    METHOD_VERSION,
    TOL_ULPS,
    _run,
    bf16_tolerance,
    bf16_ulp,
    compare,
    model_config,
    run,
)
from sglab.experiments.pcg_gate.variants import ALL_VARIANTS, gate_rows, guard_table, state_dict_keys, variant_table

GPUS = 1
gpu_short = _runs.gpu_short

__all__ = [
    "ALL_VARIANTS", "DEFAULT_PARAMS", "EXPERIMENT", "GPUS", "METHOD_VERSION", "TOL_ULPS", "bf16_tolerance",
    "bf16_ulp", "buffer_copy_bytes", "by_gpu", "compare", "copy_explanation", "gate_rows", "gate_table",
    "correctness", "gpu_short", "guard_table", "kernel_summary", "latency_table", "model_config", "newest_per_gpu",
    "reading", "run", "run_facts", "run_summary", "slowdown_start", "speedup_threshold", "state_dict_keys", "trace_table", "variant_table",
]
