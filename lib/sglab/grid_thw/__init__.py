"""Notebook 05 · a Kimi-K2.5 image grid left on cuda:0 opens a CUDA context on GPU 0 in every TP
rank ≥ 1, and its key keeps the vision cache from hitting per image (SGLang #22858)."""
