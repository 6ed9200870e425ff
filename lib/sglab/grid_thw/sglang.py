"""The record of grid_thw: the upstream PR(s), the source check, the hunks, the real-release probes."""

from __future__ import annotations

from sglab.sglang import checks as C
from sglab.sglang.fix import Fix, GpuPlan, Probe, Spec, Step, symbols_in


FIX = Fix(
    name="grid_thw", number="05", part="", prs=(22858,), gpus=2,
    title="Kimi-K2.5 grid on the CPU under image_grid_thw (#22858)",
    check=C.grid_thw,
    hunks=(Spec(22858, symbols_in(C.KIMI_PROCESSOR, "KimiGPUProcessorWrapper._gpu_call",
                                    "KimiGPUProcessorWrapper._cpu_call")
                 + symbols_in(C.KIMI_MODEL, "KimiK25ForConditionalGeneration.get_image_feature")),),
    probe=Probe("grid_thw:run", ("0.5.10.post1", "0.5.11", "0.5.23")),
    gpu=GpuPlan(2, 1, (Step("0.5.23", "sglab.sglang.gpu.grid_thw:run", {"receiver_gpu": 1}, timeout=540.0),),
                "real MultimodalDataItem over SGLang's msgpack wire to a process on GPU 1: its memory on GPU 0"),
)
