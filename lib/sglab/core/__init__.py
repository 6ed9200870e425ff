"""Measurement helpers: ``timing`` (CUDA events, host clocks), ``kernels`` (graph nodes, profiler,
nsight), ``memory`` (NVML per process and GPU)."""
