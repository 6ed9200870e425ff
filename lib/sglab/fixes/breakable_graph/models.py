"""The prefill model of the breakable-graph notebook, and the wrapper shapes ``layer_model`` resolution meets.

The model is the shared :mod:`sglab.core.toy_decoder` with learned positions and one change: its attention op is
:func:`varlen_attention`, decorated ``@eager_on_graph(True)`` like SGLang's attention layers, so a breakable capture
ends a graph segment there and replays it eagerly with the live request boundaries. It stands in for SGLang's
varlen attention backend: one dense SDPA call with a block-diagonal causal mask built from the live
``extend_seq_lens`` (tokens mix only within their request).

The shapes (``MODEL_SHAPES``) are what ``BreakableCudaGraphRunner.__init__`` has to find the stack in: a plain
CausalLM (``.model.layers``), a VLM wrapper (``.language_model.model.layers``), a GPT-2-style model
(``.transformer.layers``: nothing to find) and one more wrapper level (``.model.model.layers``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sglab.core.toy_decoder import (
    CausalLM, DecoderConfig, DecoderStack, LogitsProcessor, init_normal_,
)
from sglab.fixes.breakable_graph.breakable_cuda_graph import eager_on_graph
from sglab.fixes.breakable_graph.forward_batch import PrefillBatch, build_attn_metadata, get_forward_metadata, set_forward_context

ModelConfig = DecoderConfig  # the name this notebook's parameters and tests use

TINY_CONFIG = ModelConfig(
    vocab_size=128, hidden_size=64, num_heads=4, head_dim=16, intermediate_size=128, num_layers=2, max_position=512
)


@eager_on_graph(True)
def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention that mixes tokens only within each request, from the live forward metadata.

    q, k, v: (num_tokens, heads, head_dim). This is the graph break: its mask depends on how the tokens
    split into requests, which changes every batch.
    """
    meta = get_forward_metadata()
    n = q.shape[0]
    if n != meta.num_tokens:
        raise RuntimeError(f"attention got {n} tokens, metadata was built for {meta.num_tokens}")
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),
        k.transpose(0, 1).unsqueeze(0),
        v.transpose(0, 1).unsqueeze(0),
        attn_mask=meta.mask,
    )
    return out.squeeze(0).transpose(0, 1).reshape(n, -1)


class VarlenAttention(nn.Module):
    """The attention op of this model (``layer.self_attn.attn``): q, k, v made contiguous inside the graph
    segment, then the eager break :func:`varlen_attention`."""

    def __init__(self, num_heads: int, head_dim: int):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, head_dim

    def forward(self, q, k, v):
        return varlen_attention(q.contiguous(), k.contiguous(), v.contiguous())


class TinyCausalLM(CausalLM):
    """Plain causal LM: ``.model.layers`` + ``lm_head`` + ``logits_processor``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, VarlenAttention)


class TinyVLM(nn.Module):
    """VLM-style wrapper: the causal LM under ``.language_model`` next to a vision tower."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.vision_tower = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.language_model = TinyCausalLM(cfg)

    @torch.no_grad()
    def forward(self, input_ids, positions, forward_batch):
        return self.language_model(input_ids, positions, forward_batch)


class TinyGPTStyleLM(nn.Module):
    """The stack lives under ``.transformer`` (GPT-2 naming): there is no ``.model.layers`` to find."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.transformer = DecoderStack(cfg, VarlenAttention)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.logits_processor = LogitsProcessor()

    @torch.no_grad()
    def forward(self, input_ids, positions, forward_batch):
        hidden_states = self.transformer(input_ids, positions, forward_batch)
        return self.logits_processor(hidden_states, self.lm_head, forward_batch)


class TinyNestedWrapper(nn.Module):
    """One more wrapper level (an OCR/VLM model whose ``.model`` is a whole causal LM): the stack is at
    ``.model.model.layers``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = TinyCausalLM(cfg)

    @torch.no_grad()
    def forward(self, input_ids, positions, forward_batch):
        return self.model(input_ids, positions, forward_batch)


MODEL_SHAPES: dict[str, type[nn.Module]] = {
    "causal_lm": TinyCausalLM,
    "vlm_language_model": TinyVLM,
    "no_model_layers": TinyGPTStyleLM,
    "nested_wrapper": TinyNestedWrapper,
}


def build_model(
    cfg: ModelConfig = TINY_CONFIG,
    *,
    shape: str = "causal_lm",
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    draw_on: str = "cpu",
) -> nn.Module:
    """A model of one shape, weights from :func:`~sglab.core.toy_decoder.init_normal_` after seeding with ``seed``.

    ``draw_on="cpu"``: built and drawn on the CPU from the global RNG, then moved (the weights of the runs recorded
    before method 3, reproduced bit for bit). ``"device"``: built on ``device`` and the same distributions drawn
    there in ``dtype`` (norms 1, biases 0): other values, milliseconds instead of seconds for the 16-layer model.
    """
    if cfg.positions != "learned":
        raise ValueError("the breakable-graph model uses learned positions (positions='learned')")
    if draw_on not in ("cpu", "device"):
        raise ValueError(f"draw_on must be 'cpu' or 'device', got {draw_on!r}")
    torch.manual_seed(seed)
    if draw_on == "cpu":
        model = init_normal_(MODEL_SHAPES[shape](cfg))
        return model.to(device=device, dtype=dtype).eval()
    with torch.device(device):
        model = MODEL_SHAPES[shape](cfg)
    model = model.to(dtype=dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() < 2:
                p.fill_(1.0 if "norm" in name else 0.0)
    return init_normal_(model).eval()


@torch.no_grad()
def run_eager(model: nn.Module, batch: PrefillBatch) -> torch.Tensor:
    """Plain eager prefill with the live batch: logits of shape (batch_size, vocab)."""
    meta = build_attn_metadata(batch.extend_seq_lens_cpu, batch.num_tokens, batch.input_ids.device)
    with set_forward_context(meta):
        return model.forward(batch.input_ids, batch.positions, batch)
