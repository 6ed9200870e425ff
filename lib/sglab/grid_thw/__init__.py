"""Notebook 05 · a Kimi-K2.5 image grid left on cuda:0 opens a CUDA context on GPU 0 in every TP
rank ≥ 1, and its key keeps the vision cache from hitting per image (SGLang #22858).

- :mod:`.rebuild`  the PR-era request path, one section per upstream file, the before/after switch
- :mod:`.measure`  groups of fresh processes per variant, NVML per process and GPU, the cache point
- :mod:`.series`   the memory time series: sidecars, what each marked step added, the picture
- :mod:`.show`     the engine picture and section, the appendix's tables, "your own setup"
- :mod:`.claims`   what every run must show, the headlines and the review card
- :mod:`.sglang`   the fix's record, its source check, its real-release probes, the code path
"""
