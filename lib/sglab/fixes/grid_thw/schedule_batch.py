"""The multimodal item a request carries to the scheduler.

Upstream: ``python/sglang/srt/managers/schedule_batch.py`` ``MultimodalDataItem`` — only the fields the per-image
split and the embedding cache use. ``hash`` keys the embedding cache: one hash per image once the item is split,
one hash over all of a request's pixels while it stays bundled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class MMItem:
    """The fields of ``schedule_batch.MultimodalDataItem`` that matter here."""

    modality: str
    feature: Any = None
    offsets: list[tuple[int, int]] | None = None
    model_specific_data: dict = field(default_factory=dict)
    hash: int | None = None

    def is_image(self) -> bool:
        return self.modality == "image"

    def set_hash(self) -> int:
        """``MultimodalDataItem.set_pad_value``: hash the feature (``mm_utils.hash_feature``) once."""
        from sglab.fixes.grid_thw.mm_utils import hash_feature

        if self.hash is None:
            self.hash = hash_feature(self.feature)
        return self.hash
