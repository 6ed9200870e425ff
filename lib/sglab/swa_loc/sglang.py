"""The record of swa_loc: the upstream PR(s), the source check, the hunks, the real-release probes."""

from __future__ import annotations

from sglab.sglang import checks as C
from sglab.sglang.fix import Fix, GpuPlan, Probe, Spec, Step, symbols_in


FIX = Fix(
    name="swa_loc", number="04", part="", prs=(23552, 24743), gpus=1,
    title="SWA location preset before decode-graph capture (#23552, #24743)",
    check=C.swa_loc,
    hunks=(Spec(23552, symbols_in(C.DECODE_RUNNER, "DecodeInputBuffers.create",
                                    "DecodeInputBuffers.populate_from_forward_batch",
                                    "CudaGraphRunner.capture_one_batch_size")),
           Spec(24743, symbols_in(C.DECODE_RUNNER, "DecodeInputBuffers.create",
                                    "DecodeInputBuffers.populate_from_forward_batch"),
                first_with=C.swa_padding_zeroed)),
    probe=Probe("swa_loc:run", ("0.5.10.post1", "0.5.11", "0.5.12.post1", "0.5.13", "0.5.23")),
    gpu=GpuPlan(1, 1, (Step("0.5.11", "sglab.sglang.gpu.swa_loc:run", {"pool": False, "buffers": True}),
                 Step("0.5.12.post1", "sglab.sglang.gpu.swa_loc:run", {"pool": True, "buffers": True}),
                 Step("0.5.23", "sglab.sglang.gpu.swa_loc:run", {"pool": True, "buffers": False})),
                "real SWAKVPool.set_kv_buffer in a CUDA graph: kernel nodes per SWA layer, replay time; decode buffers"),
)
