"""Notebook 02 · the allreduce-fusion workspace floor: layernorm passes
``max_token_num=max(x.shape[0], 2048)`` to the fused all-reduce + RMSNorm (SGLang #26382, part B).

- :mod:`.rebuild`  the PR-era manager, call site and FlashInfer's IPC creation, one section per
                   upstream file; the policies (the before/after switch); the trace driver
- :mod:`.measure`  the traces, the CPU simulation, the replay and cost sweep on 2-4 GPUs, the
                   traced pass
- :mod:`.show`     tables and figures of a run (or its NoRun line), and "your own setup"
- :mod:`.claims`   what every run must show, and the headline
- :mod:`.sglang`   the fix's record, its source check, its real-release probes and the comparison
"""
