"""The small decoder-only transformer of the prefill notebooks (01, 03), shaped like SGLang's models
(``.model.layers[i].self_attn.attn``, ``lm_head``, ``logits_processor``), each layer split at
attention (``pre_attn``, ``post_attn``) so a runner can capture what lies between."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn


POSITIONS = ("rotary", "learned")


@dataclass(frozen=True)
class DecoderConfig:
    vocab_size: int = 32000
    hidden_size: int = 1024
    num_layers: int = 16
    num_heads: int = 8
    head_dim: Optional[int] = None  # default hidden_size // num_heads
    intermediate_size: int = 2816
    max_position: int = 8192
    positions: str = "learned"
    rms_eps: float = 1e-6
    rope_base: float = 10000.0

    def __post_init__(self):
        if self.positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {self.positions!r}")

    @property
    def head_size(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_heads


class Rotary(nn.Module):
    """cos/sin tables indexed by position (non-persistent buffers, in the model dtype)."""

    def __init__(self, head_dim: int, max_pos: int, base: float = 10000.0):
        super().__init__()
        self.head_dim, self.max_pos, self.base = head_dim, max_pos, base
        self.reset()

    def reset(self, device=None, dtype=torch.float32) -> None:
        """(Re)compute the tables in fp32 on ``device``, stored as ``dtype``."""
        d = self.head_dim
        inv = 1.0 / (self.base**(torch.arange(0, d, 2, dtype=torch.float32, device=device) / d))
        ang = torch.outer(torch.arange(self.max_pos, dtype=torch.float32, device=device), inv)
        ang = torch.cat([ang, ang], dim=-1)
        self.register_buffer("cos", ang.cos().to(dtype), persistent=False)
        self.register_buffer("sin", ang.sin().to(dtype), persistent=False)

    def forward(self, x, positions):  # x: (n, ..., d), q and k rotated together
        shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (x.shape[-1],)
        cos, sin = (t[positions].view(shape) for t in (self.cos, self.sin))
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class CausalAttention(nn.Module):
    """Causal attention over one sequence (``RadixAttention``'s place); no parameters."""

    def __init__(self, num_heads: int, head_dim: int):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, head_dim

    def forward(self, q, k, v):  # (n, heads, d) each -> (n, heads * d)
        n = q.shape[0]
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return o.squeeze(0).transpose(0, 1).reshape(n, self.num_heads * self.head_dim)


AttentionFactory = Callable[[int, int], nn.Module]  # (num_heads, head_dim) -> attention op module


class SelfAttention(nn.Module):

    def __init__(self, cfg: DecoderConfig, attention: AttentionFactory = CausalAttention):
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_size
        inner = self.num_heads * self.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, 3 * inner, bias=False)
        self.o_proj = nn.Linear(inner, cfg.hidden_size, bias=False)
        self.attn = attention(self.num_heads, self.head_dim)


class GatedMLP(nn.Module):

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        g, u = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(g) * u)


class DecoderLayer(nn.Module):

    def __init__(self, cfg: DecoderConfig, attention: AttentionFactory = CausalAttention):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.self_attn = SelfAttention(cfg, attention)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size)

    def pre_attn(self, h, positions, rotary: Optional[Rotary] = None):
        """Norm, qkv projection (and rotary) -> q, k, v: everything before attention."""
        n, sa = h.shape[0], self.self_attn
        qkv = sa.qkv_proj(self.input_layernorm(h)).view(n, 3, sa.num_heads, sa.head_dim)
        if rotary is None:
            return qkv.unbind(1)
        q, k = rotary(qkv[:, :2], positions).unbind(1)
        return q, k, qkv[:, 2]

    def post_attn(self, attn_out, residual):
        """Everything after attention: output projection, residual, norm, MLP, residual."""
        h = residual + self.self_attn.o_proj(attn_out)
        return h + self.mlp(self.post_attention_layernorm(h))

    def forward(self, h, positions, rotary: Optional[Rotary] = None):
        q, k, v = self.pre_attn(h, positions, rotary)
        return self.post_attn(self.self_attn.attn(q, k, v), h)


class DecoderStack(nn.Module):
    """The inner stack (SGLang's ``model.model``): embedding, layers, final norm; token-major."""

    def __init__(self, cfg: DecoderConfig, attention: AttentionFactory = CausalAttention):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        if cfg.positions == "learned":
            self.embed_positions = nn.Embedding(cfg.max_position, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, attention) for _ in range(cfg.num_layers))
        self.norm = nn.RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.rotary = Rotary(cfg.head_size, cfg.max_position,
                             cfg.rope_base) if cfg.positions == "rotary" else None

    def embed(self, input_ids, positions):
        h = self.embed_tokens(input_ids)
        if self.rotary is None:
            h = h + self.embed_positions(positions)
        return h

    def forward(self, input_ids, positions, forward_batch=None):
        """The eager prefill (attention reads the request boundaries from the forward context)."""
        h = self.embed(input_ids, positions)
        for layer in self.layers:
            h = layer(h, positions, self.rotary)
        return self.norm(h)


class LogitsProcessor(nn.Module):
    """Extend-mode logits (``LogitsProcessor.forward`` for an extend batch): the last token of every
    request, then the lm_head. Its shapes follow the number of requests, not the number of
    tokens."""

    def forward(self, hidden_states, lm_head: nn.Linear, forward_batch):
        last_index = torch.cumsum(forward_batch.extend_seq_lens, dim=0) - 1
        pruned_states = torch.index_select(hidden_states, 0, last_index)
        return F.linear(pruned_states, lm_head.weight)


class CausalLM(nn.Module):
    """A causal LM shaped as SGLang's; ``lm_head=False`` leaves the head out."""

    def __init__(self, cfg: DecoderConfig, attention: AttentionFactory = CausalAttention, *,
                 lm_head: bool = True):
        super().__init__()
        self.config = cfg
        self.model = DecoderStack(cfg, attention)
        if lm_head:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
            self.logits_processor = LogitsProcessor()

    @torch.no_grad()
    def forward(self, input_ids, positions, forward_batch):
        hidden_states = self.model(input_ids, positions, forward_batch)
        return self.logits_processor(hidden_states, self.lm_head, forward_batch)


# -- initialisation: one scheme per notebook, the weights its recorded runs were measured with ----
def init_normal_(model: nn.Module) -> nn.Module:
    """N(0, 0.02) for embeddings, N(0, 1/fan_in) for every other matrix, from the global RNG."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02 if "embed" in name else 1.0 / p.shape[-1]**0.5)
    return model


def build_on_device(factory: Callable[[], nn.Module], device, dtype, *, seed: int,
                    num_layers: int) -> nn.Module:
    """``factory()`` on ``device`` in ``dtype``, frozen, in eval mode: unit-variance projections,
    ``o_proj``/``down_proj`` scaled by ``1/sqrt(2 * layers)``, N(0, 1) embeddings, norms 1."""
    with torch.device(device):
        model = factory()
    model = model.to(dtype=dtype)
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(int(seed))
    out_scale = 1.0 / math.sqrt(2 * num_layers)
    with torch.no_grad():
        for name, prm in model.named_parameters():
            if name.endswith("norm.weight"):
                prm.fill_(1.0)
            elif "embed_tokens" in name:
                prm.normal_(0.0, 1.0, generator=gen)
            else:
                out = name.endswith(("o_proj.weight", "down_proj.weight"))
                prm.normal_(0.0, (out_scale if out else 1.0) / math.sqrt(prm.shape[1]),
                            generator=gen)
    for m in model.modules():  # the rotary tables recomputed
        if isinstance(m, Rotary):
            m.reset(device, dtype)
    model.requires_grad_(False)
    return model.eval()
