"""The toy hybrid model the experiment captures: L attention layers that do nothing but their KV write, and a
setup that builds pool, allocator and model identically for every variant.

No upstream file: this stands in for a Gemma-3 / gpt-oss style decoder (``hybrid_layer_ids`` follows their layer
patterns) so that a decode step is exactly the per-layer ``SWAKVPool.set_kv_buffer`` calls whose captured form
#23552 changed, plus two elementwise kernels per layer that make each layer's K and V.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import torch

from sglab.fixes.swa_loc.forward_batch_info import ForwardBatch
from sglab.fixes.swa_loc.swa_memory_pool import SWAKVPool, SWATokenToKVPoolAllocator


def hybrid_layer_ids(num_layers: int, swa_per_full: int) -> Tuple[List[int], List[int]]:
    """(swa_attention_layer_ids, full_attention_layer_ids) for ``swa_per_full`` sliding-window layers per full
    layer, full layers last in each group (Gemma-3: 5 local then 1 global; gpt-oss: 1 and 1).
    ``swa_per_full=0`` gives no SWA layer."""
    if num_layers < 1:
        raise ValueError("num_layers must be >= 1")
    if swa_per_full < 0:
        raise ValueError("swa_per_full must be >= 0")
    period = swa_per_full + 1
    full = [i for i in range(num_layers) if (i + 1) % period == 0]
    swa = [i for i in range(num_layers) if (i + 1) % period != 0]
    return swa, full


class ToyHybridModel:
    """``num_layers`` attention layers over an :class:`SWAKVPool`.

    Each token's hidden state is ``embed[input_id] + seq_len`` (the ``seq_len`` term stands in for everything
    that makes a token's K/V depend on its context); layer ``l`` writes ``K = h * a_l`` and ``V = h * b_l``
    through ``set_kv_buffer``. Per layer: 2 elementwise kernels + the KV write.
    """

    def __init__(self, pool: SWAKVPool, *, vocab_size: int = 1024, head_num: int, head_dim: int,
                 seed: int = 0):
        self.pool = pool
        self.num_layers = pool.layer_num
        g = torch.Generator().manual_seed(seed)
        self.embed = torch.randn(vocab_size, head_num, head_dim, generator=g).to(pool.dtype).to(pool.device)
        self.k_scale = [1.0 + 0.01 * i for i in range(self.num_layers)]
        self.v_scale = [-1.0 - 0.01 * i for i in range(self.num_layers)]

    def forward(self, input_ids: torch.Tensor, seq_lens: torch.Tensor, out_cache_loc: torch.Tensor) -> torch.Tensor:
        h = self.embed[input_ids] + seq_lens.to(self.pool.dtype)[:, None, None]
        for layer_id in range(self.num_layers):
            k = h * self.k_scale[layer_id]
            v = h * self.v_scale[layer_id]
            self.pool.set_kv_buffer(layer_id, out_cache_loc, k, v)
        return h


@dataclass
class Setup:
    pool: SWAKVPool
    allocator: SWATokenToKVPoolAllocator
    model: ToyHybridModel
    swa_layer_ids: List[int] = field(default_factory=list)
    full_layer_ids: List[int] = field(default_factory=list)


def build_setup(*, num_layers: int, swa_per_full: int = 5, size: int = 1024, size_swa: int = 512,
                head_num: int = 8, head_dim: int = 128, dtype: torch.dtype = torch.bfloat16, device="cpu",
                vocab_size: int = 1024, seed: int = 0) -> Setup:
    """Pool, allocator and model; two calls with the same arguments hand out the same slots."""
    swa_ids, full_ids = hybrid_layer_ids(num_layers, swa_per_full)
    pool = SWAKVPool(size, size_swa, head_num, head_dim, dtype, swa_ids, full_ids, device)
    allocator = SWATokenToKVPoolAllocator(size, size_swa, pool, seed=seed)
    model = ToyHybridModel(pool, vocab_size=vocab_size, head_num=head_num, head_dim=head_dim, seed=seed)
    return Setup(pool, allocator, model, swa_ids, full_ids)


def decode_batch(setup: Setup, input_ids: List[int], seq_lens: List[int]) -> ForwardBatch:
    """Allocate one new slot per request and build the decode batch (translating its SWA slots once)."""
    dev = setup.pool.device
    out_cache_loc = setup.allocator.alloc(len(input_ids))
    return ForwardBatch.init_new(torch.tensor(input_ids, dtype=torch.int64, device=dev),
                                 torch.tensor(seq_lens, dtype=torch.int32, device=dev), out_cache_loc,
                                 setup.allocator)


def pool_diff(a: SWAKVPool, b: SWAKVPool, *, skip_padding_slot: bool = True) -> Dict[int, List[int]]:
    """{global layer id: sorted slots (rows of that layer's sub-pool) where K or V differ}, layers with a
    difference only. Slot 0 (the padding slot) is skipped by default."""
    out: Dict[int, List[int]] = {}
    for layer_id in sorted(a.layers_mapping):
        ka, va = a.buffers(layer_id)
        kb, vb = b.buffers(layer_id)
        rows = ((ka != kb).flatten(1).any(1) | (va != vb).flatten(1).any(1)).nonzero().flatten().tolist()
        if skip_padding_slot:
            rows = [r for r in rows if r != 0]
        if rows:
            out[layer_id] = rows
    return out
