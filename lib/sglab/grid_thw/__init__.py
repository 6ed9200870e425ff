"""Notebook 05 · a Kimi-K2.5 image grid left on cuda:0 opens a CUDA context on GPU 0 in every TP
rank ≥ 1, and its key keeps the vision cache from hitting per image (SGLang #22858).

- :mod:`.rebuild`  the PR-era request path, one section per upstream file, the before/after switch
- :mod:`.measure`  groups of fresh processes per variant, NVML per process and GPU, the time series,
                   the CPU cache point
- :mod:`.show`     tables and figures of a run (or its NoRun line), and "your own setup"
- :mod:`.claims`   what every run must show, and the headline
- :mod:`.sglang`   the fix's record, its source check, its real-release probes and the comparison
"""
