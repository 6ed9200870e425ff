"""The record of breakable_graph: the upstream PR(s), the source check, the hunks, the real-release probes."""

from __future__ import annotations

from sglab.sglang import checks as C
from sglab.sglang.fix import Fix, GpuPlan, Probe, Spec, Step, symbols_in


FIX = Fix(
    name="breakable_graph", number="03", part="", prs=(24662,), gpus=1,
    title="Breakable CUDA graph captures only the layer stack (#24662)",
    check=C.breakable_graph,
    hunks=(Spec(24662, symbols_in(C.BREAKABLE_RUNNER, *(f"BreakableCudaGraphRunner.{m}" for m in (
        "__init__", "_run_forward", "_build_capture_forward_batch", "can_run", "replay")))),),
    probe=Probe("breakable_graph:run", ("0.5.10.post1", "0.5.11", "0.5.12.post1", "0.5.13")),
    gpu=GpuPlan(1, 1, (Step("0.5.12.post1", "sglab.sglang.gpu.breakable_graph:run"),
                 Step("0.5.23", "sglab.sglang.gpu.breakable_graph:run")),
                "real BreakableCUDAGraph capturing the toy layer stack: segments, breaks, replay vs eager"),
)
