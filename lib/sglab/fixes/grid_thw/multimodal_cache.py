"""The vision embedding cache, keyed by item hash.

Upstream: ``python/sglang/srt/mem_cache/multimodal_cache.py`` ``MultiModalStaticCache`` as ``managers/mm_utils.py``
uses it in SGLang 0.5.11 (the first release with the fix): when every item of a request has one offset (split per
image) ``_get_chunked_embedding_by_item`` looks each image up by its own hash (``get_single``) and encodes only the
misses; otherwise ``_get_chunked_embedding_full`` looks the request up by the combined hash of its items. Here the
cache is unbounded (no LRU eviction), and a lookup is one per item: per image after the split, per request while the
request stays one bundled item — the two cases the fix switches between.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglab.fixes.grid_thw.schedule_batch import MMItem


@dataclass
class CacheStats:
    lookups: int = 0          # items looked up in the cache
    hits: int = 0             # items found
    images: int = 0           # images in all requests
    images_encoded: int = 0   # images the vision tower had to encode (those of missed items)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    @property
    def image_hit_rate(self) -> float:
        return 1.0 - self.images_encoded / self.images if self.images else 0.0


class EmbeddingCache:
    """An unbounded hash -> embedding cache (the embedding itself is not computed here: only who would be
    encoded)."""

    def __init__(self) -> None:
        self._store: dict[int, int] = {}
        self.stats = CacheStats()

    def lookup_request(self, items: list[MMItem]) -> None:
        for item in items:
            n_images = len(item.offsets or [])
            self.stats.lookups += 1
            self.stats.images += n_images
            if item.hash in self._store:
                self.stats.hits += 1
            else:
                self.stats.images_encoded += n_images
                self._store[item.hash] = n_images
