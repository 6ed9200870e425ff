"""The record of pcg_gate: the upstream PR(s), the source check, the hunks, the real-release probes."""

from __future__ import annotations

from sglab.sglang import checks as C
from sglab.sglang.fix import Fix, Probe, Spec, symbols_in


FIX = Fix(
    name="pcg_gate", number="01", part="part A", prs=(26382,), gpus=1,
    title="Kimi-K2.5 wrapper: `.model` property + __setattr__ guard (#26382)",
    check=C.pcg_gate,
    hunks=(Spec(26382, symbols_in(C.KIMI_MODEL, "KimiK25ForConditionalGeneration.model",
                                    "KimiK25ForConditionalGeneration.__setattr__")),),
    probe=Probe("pcg_gate:run", ("0.5.10.post1", "0.5.12.post1", "0.5.13", "0.5.23")),
    gpu=None,
)
