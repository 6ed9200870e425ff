"""The record of workspace_floor: the upstream PR(s), the source check, the hunks, the real-release probes."""

from __future__ import annotations

from sglab.sglang import checks as C
from sglab.sglang.fix import Fix, GpuPlan, Probe, Spec, Step, symbols_in


def _probe_params() -> dict:
    from sglab.experiments.workspace_floor import real

    return real.params()


FIX = Fix(
    name="workspace_floor", number="02", part="part B", prs=(26382,), gpus=2,
    title="layernorm passes max_token_num=max(x.shape[0], 2048) to the fused AR+norm (#26382)",
    check=C.workspace_floor,
    hunks=(Spec(26382, symbols_in(C.LAYERNORM, "_forward_with_allreduce_fusion")),),
    probe=Probe("workspace_floor:run", ("0.5.12.post1", "0.5.13"), _probe_params),
    gpu=GpuPlan(2, 1, (Step("0.5.23", "sglab.sglang.gpu.workspace_floor:run"),),
                "real FlashInfer workspace on 2 GPUs (only where FlashInfer is importable)"),
)
