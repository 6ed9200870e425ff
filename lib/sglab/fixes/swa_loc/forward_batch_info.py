"""A decode batch: one new token per request.

Mirrors ``python/sglang/srt/model_executor/forward_batch_info.py`` (PR-era): ``ForwardBatch`` with
``out_cache_loc_swa``, and ``ForwardBatch.init_new`` translating ``out_cache_loc`` to SWA slots once per batch,
outside any graph -- the translation that a decode graph captured without the preset repeats in every SWA layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch

if TYPE_CHECKING:
    from sglab.fixes.swa_loc.swa_memory_pool import SWATokenToKVPoolAllocator


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # int64 [bs]
    seq_lens: torch.Tensor  # int32 [bs]
    out_cache_loc: torch.Tensor  # int64 [bs], full-pool slots
    out_cache_loc_swa: Optional[torch.Tensor] = None  # int32 [bs], SWA-pool slots

    @property
    def batch_size(self) -> int:
        return int(self.input_ids.shape[0])

    @classmethod
    def init_new(cls, input_ids: torch.Tensor, seq_lens: torch.Tensor, out_cache_loc: torch.Tensor,
                 allocator: Optional["SWATokenToKVPoolAllocator"]) -> "ForwardBatch":
        """As upstream: a hybrid-SWA batch translates ``out_cache_loc`` once, here, outside any graph."""
        out_cache_loc_swa = (allocator.translate_loc_from_full_to_swa(out_cache_loc)
                             if allocator is not None else None)
        return cls(input_ids, seq_lens.to(torch.int32), out_cache_loc, out_cache_loc_swa)
