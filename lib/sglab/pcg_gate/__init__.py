"""Notebook 01 · a VLM wrapper through the piecewise-CUDA-graph gate without registering its LLM
twice (SGLang #26382, part A).

:mod:`.rebuild` the PR-era gate and wrappers; :mod:`.measure` the GPU run; :mod:`.tables` a run and
the engine's runs as tables; :mod:`.show` the notebook's tables and figures; :mod:`.claims` what
every run must show, and the card; :mod:`.sglang` the fix's record, its probe and engine scenarios.
"""
