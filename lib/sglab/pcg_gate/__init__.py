"""Notebook 01 · a VLM wrapper through the piecewise-CUDA-graph gate without registering its LLM
twice (SGLang #26382, part A).

- :mod:`.rebuild`  the PR-era gate, the Kimi-K2.5 wrapper in its alias variants, the piecewise
  runner, one section per upstream file
- :mod:`.measure`  the GPU run: eager against piecewise prefill per token count, the host's
  per-launch cost, launch counts, profiler passes
- :mod:`.show`     tables and figures of a run (or its NoRun line), the mechanism picture, "your
  own setup"
- :mod:`.claims`   what every run must show, and the headline
- :mod:`.sglang`   the fix's record, its source check, its real-release probe and the comparison
"""
