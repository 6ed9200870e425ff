"""The Kimi-K2.5 vision-language wrapper and its ``.model`` alias, in the variants the PR chose between.

Mirrors ``python/sglang/srt/models/kimi_k25.py`` (SGLang #26382, part A): ``KimiK25ForConditionalGeneration``
reduced to its attribute shape — a ``vision_tower``, an ``mm_projector`` and the LLM under ``language_model``
(a CausalLM holding ``.model.layers``; here :class:`sglab.core.toy_decoder.CausalLM`). The PR adds
``@property model -> self.language_model`` and a ``__setattr__`` that drops any assignment to the name ``model``.

Four wrapper variants (``VARIANTS``) reproduce the before/after, plus one extra that shows why a property setter
is not enough:

``no_alias``        upstream before the PR: no ``.model``; the gate says "not a language model".
``plain_alias``     ``self.model = self.language_model.model`` in ``__init__`` (released SGLang 0.5.10.x,
                    ``models/kimi_k25.py``): the gate passes, but ``nn.Module`` registers the text model (the
                    LLM's ``.model``: embeddings, layers, final norm) a second time under ``model.*``.
``property_only``   ``@property model``: the gate passes and nothing is duplicated at construction, but the
                    runner's write-back ``wrapper.model = ...`` goes through ``nn.Module.__setattr__``, which
                    stores any ``Module`` value in ``_modules`` without consulting the class property.
``property_guard``  the PR: property plus ``__setattr__`` that returns early for ``name == "model"``.
``property_setter`` (extra) property with a ``@model.setter``: never called for a ``Module`` value, so the
                    duplicate appears exactly as with ``property_only``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import nn

from sglab.core.toy_decoder import CausalLM, DecoderConfig, build_on_device

VARIANTS = ("no_alias", "plain_alias", "property_only", "property_guard")
EXTRA_VARIANTS = ("property_setter",)

# The LLM of the CPU demonstrations: the shared decoder at a size whose key list fits on a screen.
TINY_LM = DecoderConfig(vocab_size=16, hidden_size=4, num_layers=2, num_heads=1, intermediate_size=8,
                        max_position=64, positions="rotary")


def tiny_language_model() -> CausalLM:
    """``language_model`` for CPU demonstrations (default PyTorch init from the global RNG)."""
    return CausalLM(TINY_LM)


def language_model(cfg: DecoderConfig, device, dtype=torch.bfloat16, *, seed: int = 0) -> CausalLM:
    """The measured LLM (``DeepseekV3ForCausalLM``'s attribute shape, ``.model.layers[i].self_attn.attn``), built
    on ``device`` without a host-side init. No lm_head: prefill latency stops at the final norm (the logits of the
    last token are outside the captured region upstream as well)."""
    return build_on_device(lambda: CausalLM(cfg, lm_head=False), device, dtype, seed=seed,
                           num_layers=cfg.num_layers)


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
    """Plain alias assignment, as released in SGLang 0.5.10.x (``KimiK25ForConditionalGeneration.__init__``:
    ``self.model = self.language_model.model``): registers the text model twice. The gate's write-back
    ``model.model = resolve_language_model(model)`` then re-assigns the same module (``resolve_language_model``
    returns ``model.model``), so nothing changes at the gate."""

    def __init__(self, language_model: nn.Module, **kw):
        super().__init__(language_model, **kw)
        self.model = self.language_model.model


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
    """A Kimi-shaped wrapper of one variant around ``language_model`` (a fresh :func:`tiny_language_model` by
    default), initialised from ``seed``."""
    if variant not in WRAPPERS:
        raise ValueError(f"unknown variant {variant!r}; choose from {sorted(WRAPPERS)}")
    torch.manual_seed(seed)
    if language_model is None:
        language_model = lm_factory() if lm_factory is not None else tiny_language_model()
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
    w = build_wrapper("property_guard") if wrapper_cls is KimiPropertyGuard else wrapper_cls(tiny_language_model())
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

    new_lm = tiny_language_model()
    w.language_model = new_lm
    rows.append({"action": "w.language_model = new_lm", "expected": "LLM swapped; w.model follows",
                 "observed": w.language_model is new_lm and w.model is new_lm})

    other_lm = tiny_language_model()
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
