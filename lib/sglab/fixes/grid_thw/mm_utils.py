"""Splitting a bundled image item into one item per image, and the item hash.

Upstream: ``python/sglang/srt/managers/mm_utils.py`` — ``get_new_expanded_mm_items`` (image branch: split by
``image_grid_thw``, patches per image = t·h·w; without it fall back to ``_try_simple_split``, which only applies when
the feature has one row per image) and ``hash_feature`` / ``data_hash`` (the key of the embedding cache).

Why the key rename is half of the fix: the split looks up ``image_grid_thw`` by name. Under Kimi's old key
``grid_thws`` it finds nothing, the simple split does not apply (many patches per image), and the request stays one
bundled item whose hash covers all of its pixels — so an image seen before in other company never hits the cache.
"""

from __future__ import annotations

import copy
import hashlib

import numpy as np
import torch

from sglab.fixes.grid_thw.schedule_batch import MMItem


def _get_length(value) -> int | None:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return value.shape[0] if value.ndim > 0 else None
    if isinstance(value, (list, tuple)):
        return len(value)
    return None


def _slice_model_data(data: dict, index: int, start: int, end: int, num_items: int,
                      total_feature_len: int | None) -> dict:
    sliced = {}
    for key, value in data.items():
        length = _get_length(value)
        if length == num_items:
            sliced[key] = value[index:index + 1]
        elif total_feature_len is not None and length == total_feature_len:
            sliced[key] = value[start:end]
        else:
            sliced[key] = value
    return sliced


def _try_simple_split(item: MMItem, num_items: int, out: list[MMItem]) -> bool:
    """``mm_utils._try_simple_split``: split only when the feature has exactly one row per offset."""
    if _get_length(item.feature) != num_items:
        return False
    for i in range(num_items):
        new_item = copy.copy(item)
        new_item.feature = item.feature[i:i + 1]
        new_item.offsets = [item.offsets[i]]
        new_item.model_specific_data = {
            k: (v[i:i + 1] if _get_length(v) == num_items else v) for k, v in item.model_specific_data.items()}
        new_item.hash = None
        out.append(new_item)
    return True


def _split_by_grid(item: MMItem, image_grid_thw, num_items: int) -> list[MMItem] | None:
    """The per-image split proper: slice the feature by each image's t·h·w patches (None when they do not add
    up to the feature's rows)."""
    patches_per_item = [int(torch.prod(torch.as_tensor(g, dtype=torch.long)).item()) for g in image_grid_thw]
    slice_indices = [0] + torch.cumsum(torch.tensor(patches_per_item, dtype=torch.long), dim=0).tolist()
    feature_len = _get_length(item.feature)
    if feature_len is None or slice_indices[-1] != feature_len:
        return None
    out = []
    for i in range(num_items):
        start, end = slice_indices[i], slice_indices[i + 1]
        new_item = copy.copy(item)
        new_item.feature = item.feature[start:end]
        new_item.offsets = [item.offsets[i]]
        new_item.model_specific_data = _slice_model_data(item.model_specific_data, i, start, end, num_items,
                                                         feature_len)
        new_item.hash = None
        out.append(new_item)
    return out


def get_new_expanded_mm_items(original_mm_items: list[MMItem]) -> list[MMItem]:
    """``mm_utils.get_new_expanded_mm_items`` (image branch): one item per image, by ``image_grid_thw``."""
    expanded: list[MMItem] = []
    for item in original_mm_items:
        is_bundled = item.offsets is not None and len(item.offsets) > 1
        if not (is_bundled and item.is_image()):
            expanded.append(item)
            continue
        num_items = len(item.offsets)
        image_grid_thw = item.model_specific_data.get("image_grid_thw")
        if image_grid_thw is None or _get_length(image_grid_thw) != num_items:
            if not _try_simple_split(item, num_items, expanded):
                expanded.append(item)
            continue
        split = _split_by_grid(item, image_grid_thw, num_items)
        expanded.extend(split if split is not None else [item])
    return expanded


def data_hash(data: bytes) -> int:
    """``mm_utils.data_hash``: first 8 bytes of SHA-256, big-endian unsigned."""
    return int.from_bytes(hashlib.sha256(data).digest()[:8], byteorder="big", signed=False)


def hash_feature(feature: torch.Tensor) -> int:
    """``mm_utils.hash_feature`` -> ``tensor_hash`` for a CPU tensor."""
    t = feature.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return data_hash(memoryview(t.numpy()).tobytes())
