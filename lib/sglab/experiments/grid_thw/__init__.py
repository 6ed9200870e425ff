"""Per-rank GPU-0 memory when the Kimi-K2.5 image grid travels to the TP ranks on cuda:0 (SGLang #22858).

Variants (:data:`ranks.VARIANTS`): ``before`` (grid on ``cuda:0`` under ``grid_thws``; tokenizer -> rank 0 as pickled
bytes, rank 0 -> the rest with ``broadcast_pyobj``), ``after`` (``grid_thws.cpu()`` under ``image_grid_thw``, same
path), ``ipc`` (the ``before`` output sent to every rank as a ``torch.multiprocessing`` queue sends it: a CUDA IPC
handle) and ``eager`` (``before`` with ``CUDA_MODULE_LOADING=EAGER`` in the ranks: is the growth of the stray context at
the first kernel steps lazy module loading?). Each variant × repeat is a group of fresh processes; all groups run at
once (:mod:`.run` says why that is honest), followed by one NVML sampler (:mod:`.series`). The per-image cache point
runs on the CPU.

Modules: :mod:`.ranks` (the processes), :mod:`.run` (``run``), :mod:`.series` (time series sidecars),
:mod:`.analysis` (tables), :mod:`.figures` (every plot), :mod:`.claims` (what a run must show).
"""

from sglab.experiments.grid_thw.analysis import (cache_table, cells, concurrency, explain_growth, frame, gpu0_per_rank, growth_by_step, heatmap,
                       landing, leftovers, memory_frame, memory_steps, off_rank_gpus, repeatability, run_name,
                       spread_mib, stack_limits, step_deltas, stray, visible_gpus, waste_vs_tp)
from sglab.experiments.grid_thw.ranks import KERNEL_STEPS, PHASES, VARIANTS, Variant
from sglab.experiments.grid_thw.run import EXPERIMENT, cache_rows, run, run_group, run_variant

METHOD_VERSION = 2  # 1: groups one after the other, no time series; 2: groups at once, NVML time series, marks
GPUS = 2
DEFAULT_PARAMS = {
    "tp_size": 2,
    "variants": ["before", "after", "ipc", "eager"],
    "repeats": 2,  # method 1 read the same MiB in every repeat (spread 0): two still show a spread
    "n_images": 4,
    "settle_s": 0.1,  # wait between a barrier and the NVML reading (NVML shows a change within one 10 ms tick)
    "step_pause_s": 0.1,  # between kernel steps, so that a 100 Hz series tells them apart
    "sample_hz": 100,
    "timeout_s": 120,  # per group (its ranks' run deadline)
    "start_method": "forkserver",  # processes fork from a server that imported torch once (sglab.core.dist.forkserver)
    # per-image cache point (CPU)
    "cache_requests": 200,
    "cache_pool": 24,
    "cache_max_images": 4,
    "seed": 0,
}

__all__ = [
    "EXPERIMENT", "METHOD_VERSION", "GPUS", "DEFAULT_PARAMS", "VARIANTS", "Variant", "PHASES", "KERNEL_STEPS",
    "run", "run_group", "run_variant", "cache_rows",
    "cache_table", "cells", "concurrency", "explain_growth", "frame", "gpu0_per_rank", "growth_by_step", "heatmap",
    "landing", "leftovers", "memory_frame", "memory_steps", "off_rank_gpus", "repeatability", "run_name",
    "spread_mib", "stack_limits", "step_deltas", "stray", "visible_gpus", "waste_vs_tp",
]
