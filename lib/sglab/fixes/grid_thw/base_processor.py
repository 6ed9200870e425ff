"""What the tokenizer manager ships: the processor output after the ``FEATURE_NAMES`` offload, and its items.

Upstream: ``python/sglang/srt/multimodal/processors/base_processor.py`` — ``BaseMultimodalProcessor.FEATURE_NAMES``
and the tail of ``process_mm_data`` that moves only those tensors to the CPU (Kimi's ``grid_thws`` is not among them,
so before the PR it stayed on ``cuda:0``); ``collect_mm_items_from_processor_output`` (one bundled item per
modality; feature tensors become ``feature``, the rest model-specific data), ``get_mm_items_offset`` and
``process_and_combine_mm_data`` (collect, set offsets, split per image, hash).

``FEATURE_NAMES`` is an allow-list: a model-specific processor that returns another tensor escapes it, which is
exactly how a 32-byte grid reached every TP rank on ``cuda:0``.
"""

from __future__ import annotations

from typing import Iterable

import torch

from sglab.fixes.grid_thw.kimi_k25 import IMAGE_TOKEN_ID, gpu_call
from sglab.fixes.grid_thw.mm_utils import get_new_expanded_mm_items
from sglab.fixes.grid_thw.schedule_batch import MMItem

FEATURE_NAMES = ["pixel_values", "pixel_values_videos", "audio_features", "input_features"]

ATTR_NAME_TO_MODALITY = {
    "pixel_values": "image",
    "image_grid_thw": "image",
    "grid_thws": "image",  # for kimi k2.5
    "pixel_values_videos": "video",
    "video_grid_thw": "video",
    "audio_features": "audio",
    "input_features": "audio",
}


def offload_features(result: dict, feature_names: Iterable[str] = FEATURE_NAMES) -> dict:
    """Tail of ``BaseMultimodalProcessor.process_mm_data``: move only the ``FEATURE_NAMES`` to the CPU."""
    for feature_name in feature_names:
        if feature_name in result and isinstance(result[feature_name], torch.Tensor):
            result[feature_name] = result[feature_name].to("cpu")
    return result


def process_mm_data(prompt_ids: list[int], images: list[torch.Tensor], *, fixed: bool,
                    device: str | torch.device = "cuda:0") -> dict:
    """What the tokenizer manager ships: ``_gpu_call`` followed by the ``FEATURE_NAMES`` offload."""
    return offload_features(gpu_call(prompt_ids, images, fixed=fixed, device=device))


def collect_mm_items(result: dict) -> list[MMItem]:
    """``collect_mm_items_from_processor_output``: one bundled item per modality."""
    items: dict[str, MMItem] = {}
    for attr_name, value in result.items():
        if attr_name == "input_ids":
            continue
        modality = ATTR_NAME_TO_MODALITY.get(attr_name)
        if modality is None:
            continue
        item = items.setdefault(modality, MMItem(modality=modality))
        if attr_name in FEATURE_NAMES:
            item.feature = value
        else:
            item.model_specific_data[attr_name] = value
    return list(items.values())


def get_mm_items_offset(input_ids: torch.Tensor, mm_token_id: int) -> list[tuple[int, int]]:
    """``BaseMultimodalProcessor.get_mm_items_offset``: (start, end) of each run of ``mm_token_id``."""
    mask = input_ids == mm_token_id
    start = (mask & ~torch.roll(mask, 1)).nonzero(as_tuple=True)[0]
    end = (mask & ~torch.roll(mask, -1)).nonzero(as_tuple=True)[0]
    return list(zip(start.tolist(), end.tolist()))


def items_for_request(result: dict) -> list[MMItem]:
    """``process_and_combine_mm_data``: collect items, set offsets, split per image, hash each item."""
    input_ids = result["input_ids"].flatten()
    items = collect_mm_items(result)
    for item in items:
        if item.offsets is None:
            item.offsets = get_mm_items_offset(input_ids, IMAGE_TOKEN_ID)
    items = get_new_expanded_mm_items(items)
    for item in items:
        item.set_hash()
    return items
