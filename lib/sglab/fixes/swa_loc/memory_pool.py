"""One MHA KV pool: a K and a V buffer per layer.

Mirrors ``python/sglang/srt/mem_cache/memory_pool.py`` (PR-era, April–May 2026): ``MHATokenToKVPool`` and its
``set_kv_buffer``, reduced to the torch fallback of the ``store_cache`` write (see :func:`store_cache` for the one
difference from the CUDA kernel SGLang uses).
"""

from __future__ import annotations

import torch


def store_cache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                loc: torch.Tensor) -> None:
    """Write one layer's K and V rows at ``loc``: SGLang's torch fallback ``k_cache[loc] = k; v_cache[loc] = v``.

    On CUDA SGLang uses its ``store_cache`` JIT kernel, which takes int32 or int64 locations as they are.
    torch's ``index_put_`` converts an int32 index to int64 internally (once per call); converting once here
    instead keeps that cost at one kernel per layer for an int32 location and none for int64.
    """
    if loc.dtype != torch.int64:
        loc = loc.to(torch.int64)
    k_cache[loc] = k
    v_cache[loc] = v


class MHATokenToKVPool:
    """Per-layer K and V buffers of ``size + page_size`` rows (row 0: the padding slot)."""

    def __init__(self, size: int, head_num: int, head_dim: int, layer_num: int, dtype: torch.dtype,
                 device, page_size: int = 1):
        self.size = size
        self.page_size = page_size
        self.layer_num = layer_num
        shape = (size + page_size, head_num, head_dim)
        self.k_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layer_num)]
        self.v_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layer_num)]

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor,
                      cache_v: torch.Tensor) -> None:
        store_cache(cache_k, cache_v, self.k_buffer[layer_id], self.v_buffer[layer_id], loc)
