"""The record of capture_sizes: the upstream PR(s), the source check, the hunks, the real-release probes."""

from __future__ import annotations

from sglab.sglang import checks as C
from sglab.sglang.fix import Fix, Probe, Spec, symbols_in


def _probe_params() -> dict:
    from sglab.experiments.capture_sizes import real

    return real.params()


FIX = Fix(
    name="capture_sizes", number="06", part="", prs=(23972,), gpus=2,
    title="Piecewise capture sizes aligned to the attention-TP group (#23972)",
    check=C.capture_sizes,
    hunks=(Spec(23972, symbols_in(C.PIECEWISE_RUNNER, "PiecewiseCudaGraphRunner.__init__")),),
    probe=Probe("capture_sizes:run", ("0.5.10.post1", "0.5.11", "0.5.14", "0.5.23"), _probe_params),
    gpu=None,
)
