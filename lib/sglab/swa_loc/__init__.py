"""Notebook 04 · the SWA location preset before decode-graph capture (SGLang #23552, follow-up
#24743).

- :mod:`.rebuild`  the PR-era mechanism, one section per upstream file, the before/after switch
- :mod:`.measure`  the GPU sweep: kernels per replay, replay time, KV contents, profiler passes
- :mod:`.show`     tables and figures of a run (or its NoRun line), and "your own setup"
- :mod:`.claims`   what every run must show, and the headline
- :mod:`.sglang`   the fix's record, its source check, its real-release probes and the comparison
"""
