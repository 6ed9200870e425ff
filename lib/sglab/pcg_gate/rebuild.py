"""The piecewise-CUDA-graph gate and the Kimi-K2.5 ``.model`` alias (SGLang #26382 part A), PR era.

One section per upstream file, headed by its path and symbol, to read beside the released hunk:
``server_args.py`` (the capture sizes, a batch's bucket), ``models/kimi_k25.py`` (the wrapper in the
alias variants the PR chose between: the before/after switch, :func:`build_wrapper`),
``model_runner.py`` (the gate), ``piecewise_cuda_graph_runner.py`` (one CUDA graph per piece
between two attention calls, no torch.compile). The LLM is :mod:`sglab.core.toy_decoder`.
"""

from __future__ import annotations

import bisect
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import nn

from sglab.core.toy_decoder import CausalLM, DecoderConfig
from sglab.sglang.server_args import piecewise_cuda_graph_tokens


# -- 1. python/sglang/srt/server_args.py · ServerArgs._generate_piecewise_cuda_graph_tokens --------
# piecewise_cuda_graph_tokens(max_tokens): the sizes captured (sglab.sglang.server_args)
def bucket_for(num_tokens: int, capture_tokens: list[int]) -> Optional[int]:
    """The smallest captured size >= ``num_tokens``; None above the largest (eager)."""
    sizes = sorted(capture_tokens)
    i = bisect.bisect_left(sizes, num_tokens)
    return sizes[i] if i < len(sizes) else None


# -- 2. python/sglang/srt/models/kimi_k25.py · KimiK25ForConditionalGeneration.model, .__setattr__ -
# no_alias        before the PR (0.5.11-0.5.12.post1): no .model; the gate: "not a language model"
# plain_alias     self.model = self.language_model.model in __init__ (0.5.10.x): the gate passes,
#                 but nn.Module registers the text model a second time under model.*
# property_only   @property model: nothing duplicated at construction, but the gate's write-back
#                 wrapper.model = ... goes through nn.Module.__setattr__, which stores a Module
#                 value in _modules without consulting the class property
# property_guard  the PR: the property and a __setattr__ that drops writes to "model"
# property_setter (extra) a @model.setter: never called for a Module value, so as property_only
VARIANTS = ("no_alias", "plain_alias", "property_only", "property_guard")
EXTRA_VARIANTS = ("property_setter",)
ALL_VARIANTS = VARIANTS + EXTRA_VARIANTS

# the LLM of the CPU lessons: the shared decoder at a size whose key list fits on a screen
TINY_LM = DecoderConfig(vocab_size=16, hidden_size=4, num_layers=2, num_heads=1,
                        intermediate_size=8, max_position=64, positions="rotary")


def tiny_language_model() -> CausalLM:
    """``language_model`` of the CPU lessons (default PyTorch init from the global RNG)."""
    return CausalLM(TINY_LM)


class _KimiK25Shape(nn.Module):
    """A vision tower, a projector, and the LLM (``.model.layers``) under ``language_model``."""

    def __init__(self, language_model: nn.Module):
        super().__init__()
        self.vision_tower, self.mm_projector = nn.Linear(4, 4), nn.Linear(4, 4)
        self.language_model = language_model


class KimiNoAlias(_KimiK25Shape):
    pass


class KimiPlainAlias(_KimiK25Shape):
    # the gate's write-back assigns the same module again (resolve_language_model: model.model)
    def __init__(self, language_model: nn.Module):
        super().__init__(language_model)
        self.model = self.language_model.model


class KimiPropertyOnly(_KimiK25Shape):

    @property
    def model(self):
        return self.language_model


class KimiPropertyGuard(_KimiK25Shape):

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
    setter_calls = 0  # nn.Module.__setattr__ writes _modules first for a Module: never called

    @property
    def model(self):
        return self.language_model

    @model.setter
    def model(self, value):
        type(self).setter_calls += 1


WRAPPERS: dict[str, type] = dict(
    zip(ALL_VARIANTS,
        (KimiNoAlias, KimiPlainAlias, KimiPropertyOnly, KimiPropertyGuard, KimiPropertySetter)))


def build_wrapper(variant: str, language_model: Optional[nn.Module] = None, *,
                  seed: int = 0) -> nn.Module:
    """A Kimi-shaped wrapper of one variant around ``language_model`` (or a tiny LLM)."""
    if variant not in WRAPPERS:
        raise ValueError(f"unknown variant {variant!r}; choose from {sorted(WRAPPERS)}")
    torch.manual_seed(seed)
    return WRAPPERS[variant](tiny_language_model() if language_model is None else language_model)


def has_duplicate_registration(wrapper: nn.Module) -> bool:
    return "model" in wrapper._modules


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
        parts = [
            f"{len(keys)} {what} ({keys[0]}, ...)"
            for what, keys in (("missing", self.missing), ("unexpected", self.unexpected)) if keys
        ]
        return "; ".join(parts) or self.error


def strict_load(module: nn.Module, state_dict: dict) -> LoadOutcome:
    """``load_state_dict(strict=True)``, the missing and unexpected keys in place of the error."""
    res = module.load_state_dict(state_dict, strict=False)
    try:
        module.load_state_dict(state_dict, strict=True)
        return LoadOutcome(True)
    except RuntimeError as exc:
        return LoadOutcome(False, list(res.missing_keys), list(res.unexpected_keys),
                           str(exc).splitlines()[0])


# -- 3. python/sglang/srt/model_executor/model_runner.py · ModelRunner.init_piecewise_cuda_graphs --
logger = logging.getLogger(__name__)

# the warnings of ModelRunner.init_piecewise_cuda_graphs, verbatim
NOT_A_LANGUAGE_MODEL = "Disable piecewise CUDA graph because the model is not a language model"
NO_CAPTURE_SIZE = "Disable piecewise CUDA graph because the capture size is not set"
NO_LAYERS = "Disable piecewise CUDA graph because the model does not have a 'layers' attribute"
NON_STANDARD_GQA = "Disable piecewise CUDA graph because some layers do not apply Standard GQA"
ENABLED = "Capture piecewise CUDA graph"


def resolve_language_model(model: nn.Module) -> nn.Module:
    """``model_runner.resolve_language_model``: a special case for Qwen3-Omni, else ``.model``."""
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
    wrote_model: bool = False  # the write-back ``model_runner.model.model = ...`` ran
    layer_model: Optional[nn.Module] = None
    layer_model_path: Optional[str] = None  # e.g. "language_model.model"
    num_attention_layers: int = 0


def init_piecewise_cuda_graphs(runner: ModelRunnerState) -> GateResult:
    """The PR-era gate, in upstream order (the attention-layer scan shortened to the shapes used
    here). Returns instead of building the runner."""
    if runner.disable_piecewise_cuda_graph:
        return GateResult(
            False, "Disable piecewise CUDA graph because --disable-piecewise-cuda-graph is set")
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

    # Collect attention layers and moe layers from the model. The write-back registers a second
    # copy of the LLM on a wrapper whose `model` is only a class property.
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

    runner.attention_layers, runner.moe_layers = [], []
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
        runner.moe_layers.append(getattr(getattr(layer, "mlp", None), "experts", None))

    path = next((n for n, m in runner.model.named_modules() if m is layer_model), None)
    found = dict(wrote_model=True, layer_model=layer_model, layer_model_path=path,
                 num_attention_layers=len(runner.attention_layers))
    if len(runner.attention_layers) < runner.num_hidden_layers:
        return GateResult(False, NON_STANDARD_GQA, **found)
    return GateResult(True, ENABLED, **found)


@contextmanager
def quiet_gate():
    """Keep the gate's warning off the console (the tables carry the message)."""
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


# -- 4. python/sglang/srt/model_executor/piecewise_cuda_graph_runner.py · PiecewiseCudaGraphRunner -
# How activations cross from one piece to the next (``handoff``):
# "copy"    (the recorded runs) every piece copies what the next one reads (the residual, q, k, v,
#           and the last piece's output) into fixed buffers sized for the largest bucket; with the
#           attention output, five extra tokens x hidden copies per layer
# "direct"  each piece hands over the tensors it allocated inside its capture, kept alive with the
#           graph (what SGLang's torch.compile pieces do); only the attention output is copied (SDPA
#           has no out=). Every bucket holds its own activations: for a few buckets only
HANDOFFS = ("copy", "direct")


class PiecewiseRunner:
    """Piecewise prefill of one sequence over a :class:`~sglab.core.toy_decoder.DecoderStack`: one
    CUDA graph per piece between two attention calls, attention eager on the real token count, one
    set of graphs per bucket, the batch padded up to its bucket, every capture in one memory pool.

    Piece ``i`` (0..L) is ``post_attn`` of layer i-1 (or the embedding), then ``pre_attn`` of layer
    i (or the final norm). Padded rows never mix with real ones: every op but attention works row
    by row. ``use_graphs=False`` runs the same pieces eagerly on the same padded buffers (the
    same-shape reference; what the CPU tests run; copy hand-off only)."""

    def __init__(self, text_model, attention_layers: list, capture_tokens: list[int], *,
                 use_graphs: bool = True, handoff: str = "copy"):
        if handoff not in HANDOFFS:
            raise ValueError(f"handoff must be one of {HANDOFFS}, got {handoff!r}")
        if handoff == "direct" and not use_graphs:
            raise ValueError("handoff='direct' hands over tensors captured in graphs: it needs "
                             "use_graphs=True")
        self.m, self.layers = text_model, list(text_model.layers)
        self.attention_layers = list(attention_layers)
        if len(self.attention_layers) != len(self.layers):
            raise ValueError("one attention layer per decoder layer expected")
        self.sizes = sorted(capture_tokens)
        self.use_graphs, self.handoff = use_graphs, handoff
        w = text_model.embed_tokens.weight
        like = dict(dtype=w.dtype, device=w.device)
        n_max, hidden, sa = self.sizes[-1], w.shape[1], self.layers[0].self_attn
        self.ids = torch.zeros(n_max, dtype=torch.long, device=w.device)
        self.pos = torch.arange(n_max, dtype=torch.long, device=w.device)
        self.attn_out = torch.zeros(n_max, sa.num_heads * sa.head_dim, **like)
        if handoff == "copy":
            self.res = torch.zeros(n_max, hidden, **like)
            self.q = torch.zeros(n_max, sa.num_heads, sa.head_dim, **like)
            self.k, self.v = torch.zeros_like(self.q), torch.zeros_like(self.q)
            self.out = torch.zeros(n_max, hidden, **like)
        self.graphs: dict[int, list] = {}
        self.handed: dict[int, list] = {}  # direct: per bucket and piece, the tensors it produced
        self.capture_s = 0.0

    @property
    def static_bytes(self) -> int:
        names = ("ids", "pos", "attn_out") + (
            ("res", "q", "k", "v", "out") if self.handoff == "copy" else ())
        return sum(getattr(self, n).numel() * getattr(self, n).element_size() for n in names)

    @property
    def num_graphs(self) -> int:
        return sum(len(g) for g in self.graphs.values())

    def _hidden_in(self, i: int, N: int, residual):
        """The residual stream entering piece ``i``: the embedding, or layer i-1's output."""
        if i == 0:
            return self.m.embed(self.ids[:N], self.pos[:N])
        return self.layers[i - 1].post_attn(self.attn_out[:N], residual)

    def _piece(self, i: int, N: int) -> None:
        """Copy hand-off: read the fixed buffers, write the fixed buffers."""
        h = self._hidden_in(i, N, self.res[:N])
        if i < len(self.layers):
            self.res[:N].copy_(h)
            q, k, v = self.layers[i].pre_attn(h, self.pos[:N], self.m.rotary)
            self.q[:N].copy_(q)
            self.k[:N].copy_(k)
            self.v[:N].copy_(v)
        else:
            self.out[:N].copy_(self.m.norm(h))

    def _piece_direct(self, i: int, N: int, prev: Optional[tuple]) -> tuple:
        """Direct hand-off: what the next piece and the attention read."""
        h = self._hidden_in(i, N, prev[0] if prev else None)
        if i < len(self.layers):
            return (h, *self.layers[i].pre_attn(h, self.pos[:N], self.m.rotary))
        return (self.m.norm(h),)

    def _attention(self, i: int, n: int, q, k, v) -> None:
        self.attn_out[:n].copy_(self.attention_layers[i](q[:n], k[:n], v[:n]))

    def _eager_pass(self, N: int, n: int) -> None:
        for i in range(len(self.layers)):
            self._piece(i, N)
            self._attention(i, n, self.q, self.k, self.v)
        self._piece(len(self.layers), N)

    def capture(self) -> None:
        """One graph per piece per bucket, largest bucket first, all in one memory pool."""
        if not self.use_graphs:
            return
        t0 = time.perf_counter()
        pool, stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
        torch.cuda.synchronize()
        for N in sorted(self.sizes, reverse=True):
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self._warm(N)  # at this shape on the capture stream (cuBLAS workspaces)
            stream.synchronize()
            with torch.cuda.stream(stream):
                self.graphs[N] = self._capture_bucket(N, pool)
            torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        self.capture_s = time.perf_counter() - t0

    def _warm(self, N: int) -> None:
        if self.handoff == "copy":
            self._eager_pass(N, N)
            return
        prev = None
        for i in range(len(self.layers) + 1):
            prev = self._piece_direct(i, N, prev)
            if i < len(self.layers):
                self._attention(i, N, *prev[1:])

    def _capture_bucket(self, N: int, pool) -> list:
        graphs, handed, prev = [], [], None
        for i in range(len(self.layers) + 1):
            g = torch.cuda.CUDAGraph()
            g.capture_begin(pool=pool)
            try:
                if self.handoff == "copy":
                    self._piece(i, N)
                else:
                    prev = self._piece_direct(i, N, prev)
                    handed.append(prev)
            finally:
                g.capture_end()
            graphs.append(g)
        if self.handoff == "direct":
            self.handed[N] = handed
        return graphs

    def bucket(self, n: int) -> Optional[int]:
        return bucket_for(n, self.sizes)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Prefill one sequence; returns a view of a static output (clone it to keep it)."""
        n = input_ids.shape[0]
        N = self.bucket(n)
        if N is None:
            raise ValueError(f"{n} tokens exceed the largest capture ({self.sizes[-1]})")
        self.ids[:n].copy_(input_ids)
        if not self.use_graphs:
            self._eager_pass(N, n)
            return self.out[:n]
        graphs, handed = self.graphs[N], self.handed.get(N)  # handed: direct hand-off only
        for i in range(len(self.layers)):
            graphs[i].replay()
            self._attention(i, n, *(handed[i][1:] if handed else (self.q, self.k, self.v)))
        graphs[-1].replay()
        return handed[-1][0][:n] if handed else self.out[:n]
