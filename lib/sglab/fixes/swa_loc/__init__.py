"""Pre-setting the SWA cache location before decode-graph capture (SGLang PR #23552, follow-up #24743).

One module per upstream file it mirrors (PR-era, April–May 2026):

- :mod:`.memory_pool` -- ``mem_cache/memory_pool.py``: ``MHATokenToKVPool`` and the ``store_cache`` write;
- :mod:`.swa_memory_pool` -- ``mem_cache/swa_memory_pool.py``: ``SWAKVPool`` (its ``set_kv_buffer`` branch on
  ``swa_loc``) and ``SWATokenToKVPoolAllocator`` (``full_to_swa_index_mapping``);
- :mod:`.forward_batch_info` -- ``model_executor/forward_batch_info.py``: ``ForwardBatch`` with
  ``out_cache_loc_swa`` translated once per batch;
- :mod:`.model_runner` -- ``model_executor/model_runner.py``: the eager forward that presets ``swa_loc``;
- :mod:`.cuda_graph_runner` -- ``model_executor/cuda_graph_runner.py``: ``DecodeInputBuffers`` and the capture /
  replay of the decode graphs in the three states ``before``, ``pr23552``, ``pr24743`` (``VARIANTS``);
- :mod:`.toy_model` -- no upstream file: the L-layer decode step and the setup the experiment builds.

Everything runs eagerly on the CPU too. No measuring here; :mod:`sglab.experiments.swa_loc` measures.
"""

from sglab.fixes.swa_loc.cuda_graph_runner import (SWA_LOC_BUFFER_DTYPE, VARIANTS, DecodeGraphRunner, DecodeInputBuffers,
                                RunnerConfig, runner_config)
from sglab.fixes.swa_loc.forward_batch_info import ForwardBatch
from sglab.fixes.swa_loc.memory_pool import MHATokenToKVPool, store_cache
from sglab.fixes.swa_loc.model_runner import forward_eager
from sglab.fixes.swa_loc.swa_memory_pool import SWAKVPool, SWATokenToKVPoolAllocator
from sglab.fixes.swa_loc.toy_model import Setup, ToyHybridModel, build_setup, decode_batch, hybrid_layer_ids, pool_diff

__all__ = [
    "VARIANTS", "SWA_LOC_BUFFER_DTYPE", "RunnerConfig", "runner_config", "hybrid_layer_ids", "store_cache",
    "MHATokenToKVPool", "SWAKVPool", "SWATokenToKVPoolAllocator", "ForwardBatch", "ToyHybridModel",
    "forward_eager", "DecodeInputBuffers", "DecodeGraphRunner", "Setup", "build_setup", "decode_batch",
    "pool_diff",
]
