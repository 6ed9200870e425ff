"""Seeded inputs for the rebuild: synthetic images, prompts, a stream of multi-image requests, and that stream run
through the processor path and the embedding cache (on the CPU).

No upstream counterpart: these stand in for real images and traffic. The stream draws each request's images from a
small pool, so the same image comes back in different company — the case where per-image items hit the cache and a
bundled request does not.
"""

from __future__ import annotations

import numpy as np
import torch

from sglab.fixes.grid_thw.base_processor import items_for_request, process_mm_data
from sglab.fixes.grid_thw.kimi_k25 import IMAGE_TOKEN_ID
from sglab.fixes.grid_thw.multimodal_cache import CacheStats, EmbeddingCache


def synthetic_image(image_id: int, *, base: int = 28) -> torch.Tensor:
    """A deterministic (3, H, W) uint8 image; H and W are multiples of 28 (one merge block) in [28, 84]."""
    g = torch.Generator().manual_seed(1000 + image_id)
    h = base * int(torch.randint(1, 4, (1,), generator=g))
    w = base * int(torch.randint(1, 4, (1,), generator=g))
    return torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8)


def prompt_for(n_images: int) -> list[int]:
    """Token ids of a short chat prompt with ``n_images`` image placeholders."""
    return [1, 2, 3] + [IMAGE_TOKEN_ID, 4] * n_images + [5]


def request_stream(n_requests: int, pool_size: int, max_images: int, seed: int) -> list[list[int]]:
    """Seeded multi-image requests: each draws 1..``max_images`` distinct images from a pool of
    ``pool_size`` (so images repeat across requests while whole image sets rarely do)."""
    rng = np.random.default_rng(seed)
    stream = []
    for _ in range(n_requests):
        k = int(rng.integers(1, max_images + 1))
        stream.append([int(i) for i in rng.choice(pool_size, size=k, replace=False)])
    return stream


def simulate_cache(stream: list[list[int]], *, fixed: bool) -> CacheStats:
    """Run each request of ``stream`` through the processor path (on the CPU) and the embedding cache."""
    cache = EmbeddingCache()
    images = {}
    for image_ids in stream:
        imgs = [images.setdefault(i, synthetic_image(i)) for i in image_ids]
        result = process_mm_data(prompt_for(len(imgs)), imgs, fixed=fixed, device="cpu")
        cache.lookup_request(items_for_request(result))
    return cache.stats
