"""The hybrid KV pool of a sliding-window model and its allocator.

Mirrors ``python/sglang/srt/mem_cache/swa_memory_pool.py`` (PR-era, April–May 2026):

- ``SWAKVPool``: ``layers_mapping`` {layer_id: (index in its sub-pool, is_swa)}, ``register_mapping``,
  ``set_swa_loc``, ``translate_loc_from_full_to_swa`` (``full_to_swa_index_mapping[loc].to(torch.int32)``) and the
  ``set_kv_buffer`` branch: an SWA layer writes at ``self.swa_loc`` when it is set, otherwise it translates ``loc``
  right there, in every SWA layer. The branch is Python, so a CUDA graph records whichever side was live when it
  was captured -- the whole mechanism of #23552.
- ``SWATokenToKVPoolAllocator``: the int64 ``full_to_swa_index_mapping`` of ``size + page_size`` zeros plus one
  trailing ``-1``; slot 0 of each pool is the padding slot that is never handed out.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from sglab.fixes.swa_loc.memory_pool import MHATokenToKVPool


class SWAKVPool:
    """KV cache with separate pools for full and SWA attention layers (PR-era ``SWAKVPool``).

    ``set_kv_buffer`` takes a layer id where upstream takes the ``RadixAttention`` layer and reads
    ``layer.layer_id``. ``translate_calls`` counts ``translate_loc_from_full_to_swa`` calls (a Python counter:
    under graph capture it counts what the graph recorded, not what a replay runs).
    """

    def __init__(self, size: int, size_swa: int, head_num: int, head_dim: int, dtype: torch.dtype,
                 swa_attention_layer_ids: List[int], full_attention_layer_ids: List[int], device,
                 page_size: int = 1):
        self.size = size
        self.size_swa = size_swa
        self.dtype = dtype
        self.device = torch.device(device)
        self.page_size = page_size
        self.swa_layer_nums = len(swa_attention_layer_ids)
        self.full_layer_nums = len(full_attention_layer_ids)
        self.layer_num = self.swa_layer_nums + self.full_layer_nums
        self.swa_loc: Optional[torch.Tensor] = None
        self.swa_kv_pool = MHATokenToKVPool(size_swa, head_num, head_dim, self.swa_layer_nums, dtype, device,
                                            page_size)
        self.full_kv_pool = MHATokenToKVPool(size, head_num, head_dim, self.full_layer_nums, dtype, device,
                                             page_size)
        # {layer_id: (index, is_swa_layer)}
        self.layers_mapping: Dict[int, Tuple[int, bool]] = {}
        for full_attn_layer_id, global_layer_id in enumerate(full_attention_layer_ids):
            self.layers_mapping[global_layer_id] = (full_attn_layer_id, False)
        for swa_layer_id, global_layer_id in enumerate(swa_attention_layer_ids):
            self.layers_mapping[global_layer_id] = (swa_layer_id, True)
        self.full_to_swa_index_mapping: Optional[torch.Tensor] = None
        self.translate_calls = 0

    def register_mapping(self, full_to_swa_index_mapping: torch.Tensor) -> None:
        self.full_to_swa_index_mapping = full_to_swa_index_mapping

    def is_swa_layer(self, layer_id: int) -> bool:
        return self.layers_mapping[layer_id][1]

    def set_swa_loc(self, loc: Optional[torch.Tensor]) -> None:
        self.swa_loc = loc

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        assert self.full_to_swa_index_mapping is not None
        self.translate_calls += 1
        # kv_indices could hold -1 (alloc_extend's last_loc); it maps to -1 through the trailing entry.
        return self.full_to_swa_index_mapping[kv_indices].to(torch.int32)

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor,
                      cache_v: torch.Tensor) -> None:
        layer_id_pool, is_swa_layer = self.layers_mapping[layer_id]
        if is_swa_layer:
            if self.swa_loc is not None:
                loc = self.swa_loc
            else:
                if self.full_to_swa_index_mapping is not None:
                    loc = self.translate_loc_from_full_to_swa(loc)
            self.swa_kv_pool.set_kv_buffer(layer_id_pool, loc, cache_k, cache_v)
        else:
            self.full_kv_pool.set_kv_buffer(layer_id_pool, loc, cache_k, cache_v)

    # reading the pool back (not upstream API)
    def buffers(self, layer_id: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """(k_buffer, v_buffer) of a global layer id, in its sub-pool."""
        idx, is_swa = self.layers_mapping[layer_id]
        pool = self.swa_kv_pool if is_swa else self.full_kv_pool
        return pool.k_buffer[idx], pool.v_buffer[idx]


class SWATokenToKVPoolAllocator:
    """Hands out full-pool slots, each paired with an SWA-pool slot through ``full_to_swa_index_mapping``.

    Page size 1. The free lists are seeded permutations of ``1..size`` (slot 0 is the padding slot), so a
    token's full slot and SWA slot differ, as they do once a server has run for a while.
    """

    def __init__(self, size: int, size_swa: int, kvcache: SWAKVPool, *, seed: int = 0):
        self._size_full = size
        self._size_swa = size_swa
        self.page_size = 1
        self.device = kvcache.device
        # One more item of value -1 at the end so -1 maps to -1.
        self.full_to_swa_index_mapping = torch.cat([
            torch.zeros(size + self.page_size, dtype=torch.int64, device=self.device),
            torch.tensor([-1], dtype=torch.int64, device=self.device),
        ])
        g = torch.Generator().manual_seed(seed)
        self._free_full = (torch.randperm(size, generator=g) + 1).tolist()
        self._free_swa = (torch.randperm(size_swa, generator=g) + 1).tolist()
        self._kvcache = kvcache
        self._kvcache.register_mapping(self.full_to_swa_index_mapping)

    def available_size(self) -> int:
        return min(len(self._free_full), len(self._free_swa))

    def alloc(self, need_size: int) -> torch.Tensor:
        """``need_size`` full slots (int64, on the pool's device); maps each to a fresh SWA slot."""
        if need_size > self.available_size():
            raise RuntimeError(f"out of KV slots: need {need_size}, have {self.available_size()}")
        full = self._free_full[:need_size]
        swa = self._free_swa[:need_size]
        del self._free_full[:need_size], self._free_swa[:need_size]
        full_t = torch.tensor(full, dtype=torch.int64, device=self.device)
        self.full_to_swa_index_mapping[full_t] = torch.tensor(swa, dtype=torch.int64, device=self.device)
        return full_t

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        return self._kvcache.translate_loc_from_full_to_swa(kv_indices)
