"""The piecewise-CUDA-graph gate and the Kimi-K2.5 ``.model`` alias (SGLang PR #26382, part A), PR era.

One module per upstream file:

- :mod:`.server_args` — ``ServerArgs._generate_piecewise_cuda_graph_tokens`` and the bucket pick;
- :mod:`.model_runner` — ``ModelRunner.init_piecewise_cuda_graphs`` (the gate) and ``resolve_language_model``;
- :mod:`.kimi_k25` — ``KimiK25ForConditionalGeneration`` reduced to its shape, in the alias variants;
- :mod:`.piecewise_cuda_graph_runner` — the run-time behaviour of ``PiecewiseCudaGraphRunner``.

The LLM inside the wrapper is the shared :mod:`sglab.core.toy_decoder`. No measuring here;
:mod:`sglab.experiments.pcg_gate` measures.
"""

from sglab.fixes.pcg_gate.kimi_k25 import (
    EXTRA_VARIANTS,
    TINY_LM,
    VARIANTS,
    WRAPPERS,
    KimiNoAlias,
    KimiPlainAlias,
    KimiPropertyGuard,
    KimiPropertyOnly,
    KimiPropertySetter,
    LoadOutcome,
    build_wrapper,
    guard_side_effects,
    has_duplicate_registration,
    language_model,
    strict_load,
    tiny_language_model,
)
from sglab.fixes.pcg_gate.model_runner import (
    ENABLED,
    NO_CAPTURE_SIZE,
    NO_LAYERS,
    NON_STANDARD_GQA,
    NOT_A_LANGUAGE_MODEL,
    GateResult,
    ModelRunnerState,
    init_piecewise_cuda_graphs,
    resolve_language_model,
)
from sglab.fixes.pcg_gate.piecewise_cuda_graph_runner import HANDOFFS, PiecewiseRunner
from sglab.fixes.pcg_gate.server_args import bucket_for, piecewise_cuda_graph_tokens

__all__ = [
    "ENABLED", "EXTRA_VARIANTS", "HANDOFFS", "NO_CAPTURE_SIZE", "NO_LAYERS", "NON_STANDARD_GQA",
    "NOT_A_LANGUAGE_MODEL", "TINY_LM", "VARIANTS", "WRAPPERS", "GateResult", "KimiNoAlias", "KimiPlainAlias",
    "KimiPropertyGuard", "KimiPropertyOnly", "KimiPropertySetter", "LoadOutcome", "ModelRunnerState",
    "PiecewiseRunner", "bucket_for", "build_wrapper", "guard_side_effects", "has_duplicate_registration",
    "init_piecewise_cuda_graphs", "language_model", "piecewise_cuda_graph_tokens", "resolve_language_model",
    "strict_load", "tiny_language_model",
]
