"""The piecewise-CUDA-graph gate (SGLang PR #26382, part A): who gets piecewise prefill graphs.

Mirrors ``python/sglang/srt/model_executor/model_runner.py`` at the PR era (May 2026):
``ModelRunner.init_piecewise_cuda_graphs`` (the has-``.model`` check with the "not a language model" warning,
the write-back ``model_runner.model.model = resolve_language_model(model_runner.model)``, the layer-stack
resolution ``getattr(model, "language_model", model)`` then ``.model.layers`` or ``.layers``, the attention-layer
scan) and the module-level ``resolve_language_model``.

The write-back is what the Kimi-K2.5 wrapper's guard (:mod:`.kimi_k25`) exists for: on a wrapper whose ``model``
is only a class property, ``nn.Module.__setattr__`` stores the assigned LLM in ``_modules["model"]``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Optional

from torch import nn

from sglab.fixes.pcg_gate.server_args import piecewise_cuda_graph_tokens

logger = logging.getLogger(__name__)

# The warnings of ModelRunner.init_piecewise_cuda_graphs, verbatim.
NOT_A_LANGUAGE_MODEL = "Disable piecewise CUDA graph because the model is not a language model"
NO_CAPTURE_SIZE = "Disable piecewise CUDA graph because the capture size is not set"
NO_LAYERS = "Disable piecewise CUDA graph because the model does not have a 'layers' attribute"
NON_STANDARD_GQA = "Disable piecewise CUDA graph because some layers do not apply Standard GQA"
ENABLED = "Capture piecewise CUDA graph"


# ---------------------------------------------------------------------------------------------------------------
# The gate: ModelRunner.init_piecewise_cuda_graphs (PR era) and resolve_language_model
# ---------------------------------------------------------------------------------------------------------------
def resolve_language_model(model: nn.Module) -> nn.Module:
    """``model_runner.resolve_language_model`` of the PR era: a special case for Qwen3-Omni, else ``.model``."""
    if model.__class__.__name__ == "Qwen3OmniMoeForConditionalGeneration":
        return model.thinker.model
    return model.model


@dataclass
class ModelRunnerState:
    """The fields of ``ModelRunner`` that ``init_piecewise_cuda_graphs`` reads and writes."""

    model: nn.Module
    num_hidden_layers: int
    piecewise_cuda_graph_tokens: list[int] = field(default_factory=piecewise_cuda_graph_tokens)
    disable_piecewise_cuda_graph: bool = False
    is_draft_worker: bool = False
    attention_layers: list = field(default_factory=list)
    moe_layers: list = field(default_factory=list)


@dataclass
class GateResult:
    """What the gate decided, and what it touched on the way."""

    enabled: bool
    message: str
    wrote_model: bool = False            # the write-back ``model_runner.model.model = ...`` ran
    layer_model: Optional[nn.Module] = None
    layer_model_path: Optional[str] = None   # e.g. "language_model.model"
    num_attention_layers: int = 0


def _path_of(root: nn.Module, target: nn.Module) -> Optional[str]:
    """Dotted path of ``target`` under ``root`` (first registered name; "" for root itself)."""
    for name, mod in root.named_modules():
        if mod is target:
            return name
    return None


def init_piecewise_cuda_graphs(runner: ModelRunnerState) -> GateResult:
    """The PR-era gate, in upstream order. Returns instead of building the runner (the experiment builds it)."""
    if runner.disable_piecewise_cuda_graph:
        return GateResult(False, "Disable piecewise CUDA graph because --disable-piecewise-cuda-graph is set")
    if runner.is_draft_worker:
        return GateResult(False, "Draft models use decode CUDA graphs, not PCG")

    # Disable piecewise CUDA graph for non-language models
    if not hasattr(runner.model, "model"):
        logger.warning(NOT_A_LANGUAGE_MODEL)
        return GateResult(False, NOT_A_LANGUAGE_MODEL)

    # Disable piecewise CUDA graph for non capture size
    if not runner.piecewise_cuda_graph_tokens:
        logger.warning(NO_CAPTURE_SIZE)
        return GateResult(False, NO_CAPTURE_SIZE)

    # Collect attention layers and moe layers from the model.
    # The write-back below is what registers a second copy of the LLM on a wrapper whose `model` is only a
    # class property: nn.Module.__setattr__ puts a Module value into _modules["model"].
    runner.model.model = resolve_language_model(runner.model)
    language_model = getattr(runner.model, "language_model", runner.model)

    # Resolve model with layers: CausalLM wrapper (.model.layers) or direct text model (.layers)
    if hasattr(language_model, "model") and hasattr(language_model.model, "layers"):
        layer_model = language_model.model
    elif hasattr(language_model, "layers"):
        layer_model = language_model
    else:
        logger.warning(NO_LAYERS)
        return GateResult(False, NO_LAYERS, wrote_model=True)

    runner.attention_layers = []
    runner.moe_layers = []
    for layer in layer_model.layers:
        attn_layer = None
        if hasattr(layer, "self_attn"):
            if hasattr(layer.self_attn, "attn"):
                attn_layer = layer.self_attn.attn
            elif hasattr(layer.self_attn, "attn_mqa"):  # DeepSeek
                attn_layer = layer.self_attn.attn_mqa
        elif hasattr(layer, "attn"):
            attn_layer = layer.attn
        if attn_layer is not None:
            runner.attention_layers.append(attn_layer)
        moe = getattr(getattr(layer, "mlp", None), "experts", None)
        runner.moe_layers.append(moe)

    path = _path_of(runner.model, layer_model)
    if len(runner.attention_layers) < runner.num_hidden_layers:
        return GateResult(False, NON_STANDARD_GQA, wrote_model=True, layer_model=layer_model,
                          layer_model_path=path, num_attention_layers=len(runner.attention_layers))
    return GateResult(True, ENABLED, wrote_model=True, layer_model=layer_model, layer_model_path=path,
                      num_attention_layers=len(runner.attention_layers))
