"""The piecewise-CUDA-graph gate and the Kimi-K2.5 ``.model`` alias (SGLang PR #26382, part A).

Mirrors, PR-era (May 2026):

- ``python/sglang/srt/model_executor/model_runner.py``: ``ModelRunner.init_piecewise_cuda_graphs`` (the gate:
  has-``.model`` check with the "not a language model" warning, the write-back
  ``model_runner.model.model = resolve_language_model(model_runner.model)``, the layer-stack resolution
  ``getattr(model, "language_model", model)`` then ``.model.layers`` or ``.layers``, the attention-layer scan)
  and the module-level ``resolve_language_model``.
- ``python/sglang/srt/server_args.py``: ``ServerArgs._generate_piecewise_cuda_graph_tokens`` (the token-count
  buckets that get one capture each) and the runner's pick of the smallest bucket >= the token count.
- ``python/sglang/srt/models/kimi_k25.py``: ``KimiK25ForConditionalGeneration``, reduced to its shape: a
  ``vision_tower``, an ``mm_projector`` and the LLM under ``language_model`` (a CausalLM holding
  ``.model.layers``). The PR adds ``@property model -> self.language_model`` and a ``__setattr__`` that drops
  any assignment to the name ``model``.

Four wrapper variants (``VARIANTS``) reproduce the before/after, plus one extra that shows why a property
setter is not enough:

``no_alias``        upstream before the PR: no ``.model``; the gate says "not a language model".
``plain_alias``     ``self.model = self.language_model`` in ``__init__``: the gate passes, but ``nn.Module``
                    registers the LLM a second time under ``model.*``.
``property_only``   ``@property model``: the gate passes and nothing is duplicated at construction, but the
                    runner's write-back ``wrapper.model = ...`` goes through ``nn.Module.__setattr__``, which
                    stores any ``Module`` value in ``_modules`` without consulting the class property.
``property_guard``  the PR: property plus ``__setattr__`` that returns early for ``name == "model"``.
``property_setter`` (extra) property with a ``@model.setter``: never called for a ``Module`` value, so the
                    duplicate appears exactly as with ``property_only``.

No measuring here; :mod:`sglab.experiments.pcg_gate` measures.
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import nn

logger = logging.getLogger(__name__)

# The warnings of ModelRunner.init_piecewise_cuda_graphs, verbatim.
NOT_A_LANGUAGE_MODEL = "Disable piecewise CUDA graph because the model is not a language model"
NO_CAPTURE_SIZE = "Disable piecewise CUDA graph because the capture size is not set"
NO_LAYERS = "Disable piecewise CUDA graph because the model does not have a 'layers' attribute"
NON_STANDARD_GQA = "Disable piecewise CUDA graph because some layers do not apply Standard GQA"
ENABLED = "Capture piecewise CUDA graph"

VARIANTS = ("no_alias", "plain_alias", "property_only", "property_guard")
EXTRA_VARIANTS = ("property_setter",)


# ---------------------------------------------------------------------------------------------------------------
# Capture sizes: ServerArgs._generate_piecewise_cuda_graph_tokens and the runner's bucket pick
# ---------------------------------------------------------------------------------------------------------------
def piecewise_cuda_graph_tokens(max_tokens: int = 4096) -> list[int]:
    """Token counts that get one piecewise capture each (``--piecewise-cuda-graph-max-tokens`` = max_tokens)."""
    sizes = (
        list(range(4, 33, 4))
        + list(range(48, 257, 16))
        + list(range(288, 513, 32))
        + list(range(576, 1024 + 1, 64))
        + list(range(1280, 4096 + 1, 256))
        + list(range(4608, max_tokens + 1, 512))
    )
    return [s for s in sizes if s <= max_tokens]


def bucket_for(num_tokens: int, capture_tokens: list[int]) -> Optional[int]:
    """Smallest captured size >= num_tokens (the static shape the batch is padded to), or None when the batch
    is larger than every capture (the runner then falls back to the eager forward)."""
    sizes = sorted(capture_tokens)
    i = bisect.bisect_left(sizes, num_tokens)
    return sizes[i] if i < len(sizes) else None


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


# ---------------------------------------------------------------------------------------------------------------
# A tiny language model with the DeepseekV3ForCausalLM attribute shape (CPU demonstrations)
# ---------------------------------------------------------------------------------------------------------------
class SplitPoint(nn.Module):
    """Stands for ``RadixAttention``: the op piecewise capture breaks at. No parameters."""


class TinySelfAttn(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.qkv_proj = nn.Linear(hidden, 3 * hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)
        self.attn = SplitPoint()


class TinyDecoderLayer(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.self_attn = TinySelfAttn(hidden)
        self.mlp = nn.Linear(hidden, hidden, bias=False)


class TinyTextModel(nn.Module):
    def __init__(self, vocab: int, hidden: int, num_layers: int):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(TinyDecoderLayer(hidden) for _ in range(num_layers))
        self.norm = nn.LayerNorm(hidden, bias=False)


class TinyCausalLM(nn.Module):
    """``language_model``: ``.model`` (embed, layers, norm) and ``.lm_head``, like DeepseekV3ForCausalLM."""

    def __init__(self, vocab: int = 16, hidden: int = 4, num_layers: int = 2):
        super().__init__()
        self.model = TinyTextModel(vocab, hidden, num_layers)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)


# ---------------------------------------------------------------------------------------------------------------
# The Kimi-K2.5 wrapper shape, in the variants
# ---------------------------------------------------------------------------------------------------------------
class _KimiK25Shape(nn.Module):
    """``KimiK25ForConditionalGeneration`` reduced to its attribute shape."""

    def __init__(self, language_model: nn.Module, vision_dim: int = 4, text_hidden: int = 4):
        super().__init__()
        self.vision_tower = nn.Linear(vision_dim, vision_dim)
        self.mm_projector = nn.Linear(vision_dim, text_hidden)
        self.language_model = language_model


class KimiNoAlias(_KimiK25Shape):
    """Before the PR: the LLM only under ``language_model``."""


class KimiPlainAlias(_KimiK25Shape):
    """Plain alias assignment (the pattern of the earlier #20747 and of InternVL): registers the LLM twice."""

    def __init__(self, language_model: nn.Module, **kw):
        super().__init__(language_model, **kw)
        self.model = self.language_model


class KimiPropertyOnly(_KimiK25Shape):
    """Read-only alias as a class property, without the guard."""

    @property
    def model(self):
        return self.language_model


class KimiPropertyGuard(_KimiK25Shape):
    """The PR: the property, and ``__setattr__`` dropping writes to ``model``."""

    @property
    def model(self):
        # Alias .model to .language_model so this class satisfies the piecewise
        # CUDA graph gate, which checks `hasattr(model, "model")`.
        return self.language_model

    def __setattr__(self, name, value):
        # Skip the runner's redundant self.model.model assignment to avoid a
        # duplicate nn.Module registration.
        if name == "model":
            return
        super().__setattr__(name, value)


class KimiPropertySetter(_KimiK25Shape):
    """Property with a setter that ignores the value. ``nn.Module.__setattr__`` never calls the setter for a
    ``Module`` value (it writes ``_modules`` first), so this behaves like ``property_only``."""

    setter_calls = 0

    @property
    def model(self):
        return self.language_model

    @model.setter
    def model(self, value):
        type(self).setter_calls += 1


WRAPPERS: dict[str, type] = {
    "no_alias": KimiNoAlias,
    "plain_alias": KimiPlainAlias,
    "property_only": KimiPropertyOnly,
    "property_guard": KimiPropertyGuard,
    "property_setter": KimiPropertySetter,
}


def build_wrapper(variant: str, language_model: Optional[nn.Module] = None, *, seed: int = 0,
                  lm_factory: Optional[Callable[[], nn.Module]] = None) -> nn.Module:
    """A Kimi-shaped wrapper of one variant around ``language_model`` (a fresh :class:`TinyCausalLM` by default),
    initialised from ``seed``."""
    if variant not in WRAPPERS:
        raise ValueError(f"unknown variant {variant!r}; choose from {sorted(WRAPPERS)}")
    torch.manual_seed(seed)
    if language_model is None:
        language_model = lm_factory() if lm_factory is not None else TinyCausalLM()
    return WRAPPERS[variant](language_model)


def has_duplicate_registration(wrapper: nn.Module) -> bool:
    """True when the LLM sits in ``_modules`` under a second name (``model``)."""
    return "model" in wrapper._modules


# ---------------------------------------------------------------------------------------------------------------
# Save -> load round trips (what a duplicate breaks)
# ---------------------------------------------------------------------------------------------------------------
@dataclass
class LoadOutcome:
    ok: bool
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    error: str = ""

    @property
    def summary(self) -> str:
        if self.ok:
            return "clean"
        parts = []
        if self.missing:
            parts.append(f"{len(self.missing)} missing ({self.missing[0]}, ...)")
        if self.unexpected:
            parts.append(f"{len(self.unexpected)} unexpected ({self.unexpected[0]}, ...)")
        return "; ".join(parts) or self.error


def strict_load(module: nn.Module, state_dict: dict) -> LoadOutcome:
    """``load_state_dict(strict=True)``, returning the missing/unexpected key lists instead of raising."""
    res = module.load_state_dict(state_dict, strict=False)
    missing, unexpected = list(res.missing_keys), list(res.unexpected_keys)
    try:
        module.load_state_dict(state_dict, strict=True)
        return LoadOutcome(True)
    except RuntimeError as exc:
        return LoadOutcome(False, missing, unexpected, str(exc).splitlines()[0])


# ---------------------------------------------------------------------------------------------------------------
# The guard's side effects
# ---------------------------------------------------------------------------------------------------------------
def guard_side_effects(wrapper_cls: type = KimiPropertyGuard) -> list[dict]:
    """What still registers on a guarded wrapper, and the legitimate write the guard swallows.

    Each row: ``action``, ``expected`` (what nn.Module normally does), ``observed`` (bool: it happened).
    """
    w = build_wrapper("property_guard") if wrapper_cls is KimiPropertyGuard else wrapper_cls(TinyCausalLM())
    rows = []

    w.logit_scale = nn.Parameter(torch.ones(1))
    rows.append({"action": "w.logit_scale = nn.Parameter(...)", "expected": "registered as a parameter",
                 "observed": "logit_scale" in w._parameters and "logit_scale" in dict(w.named_parameters())})

    w.register_buffer("pos_table", torch.zeros(3))
    w.pos_table = torch.arange(3.0)  # reassigning a buffer goes through __setattr__
    rows.append({"action": "w.pos_table = tensor (existing buffer)", "expected": "buffer replaced",
                 "observed": "pos_table" in w._buffers and bool(torch.equal(w._buffers["pos_table"],
                                                                               torch.arange(3.0)))})

    adapter = nn.Linear(4, 4)
    w.adapter = adapter
    rows.append({"action": "w.adapter = nn.Linear(...)", "expected": "registered as a submodule",
                 "observed": w._modules.get("adapter") is adapter and "adapter.weight" in w.state_dict()})

    w.num_image_tokens = 7
    rows.append({"action": "w.num_image_tokens = 7", "expected": "plain attribute set",
                 "observed": getattr(w, "num_image_tokens", None) == 7})

    new_lm = TinyCausalLM()
    w.language_model = new_lm
    rows.append({"action": "w.language_model = new_lm", "expected": "LLM swapped; w.model follows",
                 "observed": w.language_model is new_lm and w.model is new_lm})

    other_lm = TinyCausalLM()
    try:
        w.model = other_lm
        raised = False
    except Exception:  # noqa: BLE001 - we only record whether anything complained
        raised = True
    rows.append({"action": "w.model = other_lm (a legitimate swap)", "expected": "LLM swapped (or an error)",
                 "observed": (w.model is other_lm) or raised})
    rows.append({"action": "  ... silently ignored?", "expected": "no",
                 "observed": (w.model is not other_lm) and not raised})
    return rows
