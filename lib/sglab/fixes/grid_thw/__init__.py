"""The request path of a Kimi-K2.5 image request, before and after SGLang PR #22858.

Upstream: https://github.com/sgl-project/sglang/pull/22858 ("[VLM] Enable per-image ViT cache and avoid TP CUDA
context creation for Kimi-K2.5"). One module per upstream concern:

- :mod:`.kimi_k25` — ``multimodal/processors/kimi_k25.py``: the GPU preprocessor and ``_gpu_call`` (the fix:
  ``grid_thws.cpu()`` under the key ``image_grid_thw``);
- :mod:`.base_processor` — ``base_processor.py``: the ``FEATURE_NAMES`` offload, items, offsets;
- :mod:`.mm_utils` — ``managers/mm_utils.py``: the per-image split and the item hash;
- :mod:`.schedule_batch` — ``MultimodalDataItem``; :mod:`.multimodal_cache` — the embedding cache;
- :mod:`.transport` — ``send_pyobj`` / ``recv_pyobj``, ``broadcast_pyobj``, the CUDA IPC path, named wires;
- :mod:`.workload` — seeded images, prompts and request streams (no upstream counterpart).

Everything runs on the CPU as well (``device="cpu"``); nothing here measures.
"""

from sglab.fixes.grid_thw.base_processor import (ATTR_NAME_TO_MODALITY, FEATURE_NAMES, collect_mm_items, get_mm_items_offset,
                             items_for_request, offload_features, process_mm_data)
from sglab.fixes.grid_thw.kimi_k25 import (IMAGE_MEAN, IMAGE_STD, IMAGE_TOKEN_ID, IN_PATCH_LIMIT, MERGE_KERNEL_SIZE,
                       PATCH_LIMIT_ON_ONE_SIDE, PATCH_SIZE, gpu_call, gpu_preprocess_images, navit_resize_config)
from sglab.fixes.grid_thw.mm_utils import data_hash, get_new_expanded_mm_items, hash_feature
from sglab.fixes.grid_thw.multimodal_cache import CacheStats, EmbeddingCache
from sglab.fixes.grid_thw.schedule_batch import MMItem
from sglab.fixes.grid_thw.transport import (WIRES, Wire, broadcast_pyobj, grid_key, ipc_dumps, recv_pyobj, send_pyobj, tensor_devices,
                        wire)
from sglab.fixes.grid_thw.workload import prompt_for, request_stream, simulate_cache, synthetic_image

__all__ = [
    "ATTR_NAME_TO_MODALITY", "FEATURE_NAMES", "collect_mm_items", "get_mm_items_offset", "items_for_request",
    "offload_features", "process_mm_data",
    "IMAGE_MEAN", "IMAGE_STD", "IMAGE_TOKEN_ID", "IN_PATCH_LIMIT", "MERGE_KERNEL_SIZE", "PATCH_LIMIT_ON_ONE_SIDE",
    "PATCH_SIZE", "gpu_call", "gpu_preprocess_images", "navit_resize_config",
    "data_hash", "get_new_expanded_mm_items", "hash_feature",
    "CacheStats", "EmbeddingCache", "MMItem",
    "WIRES", "Wire", "broadcast_pyobj", "grid_key", "ipc_dumps", "recv_pyobj", "send_pyobj", "tensor_devices", "wire",
    "prompt_for", "request_stream", "simulate_cache", "synthetic_image",
]
