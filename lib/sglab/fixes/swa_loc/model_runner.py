"""The eager forward of a decode batch.

Mirrors ``python/sglang/srt/model_executor/model_runner.py`` (PR-era): ``ModelRunner._forward_raw``'s path without
a CUDA graph, which calls ``token_to_kv_pool.set_swa_loc(forward_batch.out_cache_loc_swa)`` before the model
runs, so no SWA layer translates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from sglab.fixes.swa_loc.forward_batch_info import ForwardBatch
    from sglab.fixes.swa_loc.toy_model import ToyHybridModel


def forward_eager(model: "ToyHybridModel", batch: "ForwardBatch", *,
                  use_precomputed_swa_loc: bool = True) -> torch.Tensor:
    """``ModelRunner._forward_raw`` without a graph: with ``use_precomputed_swa_loc`` (what upstream does when
    ``forward_batch.out_cache_loc_swa`` is set) the pool's ``swa_loc`` is set first and no SWA layer translates;
    without it every SWA layer translates. Like upstream, ``swa_loc`` is left set afterwards."""
    if use_precomputed_swa_loc and batch.out_cache_loc_swa is not None:
        model.pool.set_swa_loc(batch.out_cache_loc_swa)
    return model.forward(batch.input_ids, batch.seq_lens, batch.out_cache_loc)
