"""Notebook 02 · the allreduce-fusion workspace floor: layernorm passes
``max_token_num=max(x.shape[0], 2048)`` to the fused all-reduce + RMSNorm (SGLang #26382, part B).

- :mod:`.rebuild`  the PR-era manager, call site and FlashInfer's IPC creation; the policies
- :mod:`.traces`   the serving traces the call site sees, and the exact simulation over them
- :mod:`.measure`  the replay, cost sweep and traced pass on 2-4 GPUs
- :mod:`.show`     tables and figures of a run (or its NoRun line), and the engine's section
- :mod:`.claims`   what every run must show, the headline and the review card
- :mod:`.sglang`   the fix's record, its source check, code path, real-release probes and engine
"""
