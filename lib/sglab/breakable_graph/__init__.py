"""Notebook 03 · the breakable CUDA graph captures only the layer stack, so one graph serves prefill
batches of any request count (SGLang #24662).

- :mod:`.rebuild`  the PR-era mechanism, one section per upstream file, the before/after boundary
- :mod:`.measure`  the GPU run: 3 requests through each graph, after vs eager, hit rate, latency,
                   launches (traced pass), ``layer_model`` resolution
- :mod:`.show`     tables and figures of a run (or its NoRun line), the slide's picture of one
                   capture, and "your own setup"
- :mod:`.claims`   what every run must show, and the headline
- :mod:`.sglang`   the fix's record, its source check, its real-release probes and the comparison
"""
