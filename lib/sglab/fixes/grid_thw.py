"""The request path of a Kimi-K2.5 image request, before and after SGLang PR #22858.

Upstream: https://github.com/sgl-project/sglang/pull/22858 ("[VLM] Enable per-image ViT cache and avoid
TP CUDA context creation for Kimi-K2.5", merged 2026-04). What this module mirrors, PR-era:

- ``python/sglang/srt/multimodal/processors/kimi_k25.py``: ``navit_resize_config``,
  ``_process_single_image`` / ``_gpu_preprocess_images`` and ``KimiGPUProcessorWrapper._gpu_call``. Before
  the PR ``_gpu_call`` returned ``{"input_ids", "pixel_values", "grid_thws"}`` with both tensors built on
  ``cuda:0`` in the tokenizer-manager process. The PR added ``grid_thws = grid_thws.cpu()`` and renamed the
  key to the SGLang-standard ``"image_grid_thw"``.
- ``python/sglang/srt/multimodal/processors/base_processor.py``: ``BaseMultimodalProcessor.FEATURE_NAMES``
  and the tail of ``process_mm_data`` that moves only those tensors to the CPU (``grid_thws`` is not among
  them, so before the PR it stayed on ``cuda:0``); ``collect_mm_items_from_processor_output`` (one bundled
  item per modality, feature tensors renamed to ``feature``, the rest kept as model-specific data) and
  ``get_mm_items_offset``.
- ``python/sglang/srt/managers/mm_utils.py``: ``get_new_expanded_mm_items`` (image branch: split a bundled
  item into one item per image using ``image_grid_thw``; without it, fall back to ``_try_simple_split``,
  which only works when the feature has one row per image) and ``hash_feature`` / ``data_hash`` (the item
  hash that keys the multimodal embedding cache).
- The transport: tokenizer manager -> scheduler TP rank 0 is ZMQ ``send_pyobj`` / ``recv_pyobj``, i.e.
  ``pickle.dumps`` / ``pickle.loads`` (``send_pyobj`` / ``recv_pyobj`` below); rank 0 -> the other TP ranks
  is ``broadcast_pyobj`` in ``python/sglang/srt/utils/common.py`` (pickle, then two ``dist.broadcast`` of the
  size and the bytes over the CPU (gloo) group, then ``pickle.loads``). Plain pickle writes a CUDA tensor
  by value together with its device (``torch.storage`` ``__reduce__`` -> ``torch.save``), so ``pickle.loads``
  re-creates it on ``cuda:0`` -- in whichever process unpickles it. The third path, ``ipc_dumps``, is what a
  ``torch.multiprocessing`` queue does (``ForkingPickler`` with torch's reducers): it sends a CUDA IPC
  handle, and the receiver opens it on the tensor's device, ``cuda:0`` again.

Everything here runs on the CPU as well (``device="cpu"``); nothing here measures.
"""

from __future__ import annotations

import copy
import hashlib
import io
import pickle
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np
import torch
import torch.nn.functional as F

# --------------------------------------------------------------------------------------------------------
# kimi_k25.py: GPU image preprocessing (resize -> pad -> normalize -> patchify)
# --------------------------------------------------------------------------------------------------------

# Kimi-K2.5 media_proc_cfg values (patch 14, merge 2); the limits are small so that the CPU path is fast.
PATCH_SIZE = 14
MERGE_KERNEL_SIZE = 2
IN_PATCH_LIMIT = 16384
PATCH_LIMIT_ON_ONE_SIDE = 512
IMAGE_MEAN = (0.5, 0.5, 0.5)
IMAGE_STD = (0.5, 0.5, 0.5)
IMAGE_TOKEN_ID = 163605  # <|media_pad|> in Kimi's tokenizer (hf_config.media_placeholder_token_id)


def navit_resize_config(width: int, height: int, patch_size: int = PATCH_SIZE,
                        merge_kernel_size: int = MERGE_KERNEL_SIZE, in_patch_limit: int = IN_PATCH_LIMIT,
                        patch_limit_on_one_side: int = PATCH_LIMIT_ON_ONE_SIDE) -> dict:
    """``kimi_k25.navit_resize_config``: NaViT target size and token count (pure math)."""
    s1 = (in_patch_limit / (max(1.0, width // patch_size) * max(1.0, height // patch_size))) ** 0.5
    s2 = patch_limit_on_one_side * patch_size / width
    s3 = patch_limit_on_one_side * patch_size / height
    scale = min(1.0, s1, s2, s3)
    new_w = min(max(1, int(width * scale)), patch_limit_on_one_side * patch_size)
    new_h = min(max(1, int(height * scale)), patch_limit_on_one_side * patch_size)
    factor = merge_kernel_size * patch_size
    pad_h = (factor - new_h % factor) % factor
    pad_w = (factor - new_w % factor) % factor
    num_tokens = ((new_h + pad_h) // factor) * ((new_w + pad_w) // factor)
    return {"num_tokens": num_tokens, "new_width": new_w, "new_height": new_h,
            "pad_width": pad_w, "pad_height": pad_h}


def _process_single_image(image: torch.Tensor, config: dict, image_mean: torch.Tensor,
                          image_std_inv: torch.Tensor, patch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``kimi_k25._process_single_image``: one (C, H, W) uint8 image -> patches and its [t, h, w] grid.

    The grid is created with ``device=x.device``: on the device the image was processed on.
    """
    x = image.unsqueeze(0).float()
    x = F.interpolate(x, size=(config["new_height"], config["new_width"]), mode="bicubic",
                      align_corners=False)
    if config["pad_height"] > 0 or config["pad_width"] > 0:
        x = F.pad(x, (0, config["pad_width"], 0, config["pad_height"]), value=0.0)
    x = x / 255.0
    x = (x - image_mean) * image_std_inv
    _, C, H, W = x.shape
    T = 1
    gh, gw = H // patch_size, W // patch_size
    x = x.view(T, C, gh, patch_size, gw, patch_size)
    x = x.permute(0, 2, 4, 1, 3, 5).reshape(-1, C, patch_size, patch_size)
    grid_thw = torch.tensor([T, gh, gw], dtype=torch.int64, device=x.device)
    return x, grid_thw


def gpu_preprocess_images(images: list[torch.Tensor], device: str | torch.device,
                          patch_size: int = PATCH_SIZE) -> tuple[torch.Tensor, torch.Tensor, list[dict]]:
    """``kimi_k25._gpu_preprocess_images`` (one image at a time; upstream batches equal sizes, same result).

    Returns ``pixel_values`` (sum of patches, 3, p, p) and ``grid_thws`` (n_images, 3) int64, both on
    ``device``, plus the resize configs (for the token expansion).
    """
    device = torch.device(device)
    image_mean = torch.tensor(IMAGE_MEAN, device=device, dtype=torch.float32).view(1, 3, 1, 1)
    image_std_inv = (1.0 / torch.tensor(IMAGE_STD, device=device, dtype=torch.float32)).view(1, 3, 1, 1)
    configs, patches, grids = [], [], []
    for image in images:
        h, w = image.shape[1], image.shape[2]
        config = navit_resize_config(w, h, patch_size)
        p, g = _process_single_image(image.to(device), config, image_mean, image_std_inv, patch_size)
        configs.append(config)
        patches.append(p)
        grids.append(g)
    return torch.cat(patches, dim=0), torch.stack(grids, dim=0), configs


def gpu_call(prompt_ids: list[int], images: list[torch.Tensor], *, fixed: bool,
             device: str | torch.device = "cuda:0") -> dict:
    """``KimiGPUProcessorWrapper._gpu_call``, before (``fixed=False``) or after (``fixed=True``) the PR.

    ``prompt_ids`` holds one ``IMAGE_TOKEN_ID`` per image; it is expanded to each image's token count
    (upstream expands the text, then tokenizes: same ids).
    """
    pixel_values, grid_thws, configs = gpu_preprocess_images(images, device)
    input_ids: list[int] = []
    it = iter(configs)
    for tok in prompt_ids:
        input_ids.extend([IMAGE_TOKEN_ID] * next(it)["num_tokens"] if tok == IMAGE_TOKEN_ID else [tok])
    input_ids_t = torch.tensor([input_ids], dtype=torch.int64)
    if not fixed:
        # PR-era before: the grid stays where it was built, under Kimi's own key.
        return {"input_ids": input_ids_t, "pixel_values": pixel_values, "grid_thws": grid_thws}
    # The fix: move the grid to the CPU and use the SGLang-standard key.
    grid_thws = grid_thws.cpu()
    return {"input_ids": input_ids_t, "pixel_values": pixel_values, "image_grid_thw": grid_thws}


# --------------------------------------------------------------------------------------------------------
# base_processor.py: FEATURE_NAMES offload, items, offsets
# --------------------------------------------------------------------------------------------------------

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
        """``MultimodalDataItem.set_pad_value``: hash the feature (``hash_feature``) once."""
        if self.hash is None:
            self.hash = hash_feature(self.feature)
        return self.hash


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


# --------------------------------------------------------------------------------------------------------
# mm_utils.py: per-image split and hashing
# --------------------------------------------------------------------------------------------------------


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


def get_new_expanded_mm_items(original_mm_items: list[MMItem]) -> list[MMItem]:
    """``mm_utils.get_new_expanded_mm_items`` (image branch): one item per image, by ``image_grid_thw``.

    Under Kimi's old key ``grid_thws`` the lookup finds nothing, the simple split does not apply (there
    are many patches per image) and the request stays one bundled item.
    """
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
        patches_per_item = [int(torch.prod(torch.as_tensor(g, dtype=torch.long)).item()) for g in image_grid_thw]
        slice_indices = [0] + torch.cumsum(torch.tensor(patches_per_item, dtype=torch.long), dim=0).tolist()
        feature_len = _get_length(item.feature)
        if feature_len is None or slice_indices[-1] != feature_len:
            expanded.append(item)
            continue
        for i in range(num_items):
            start, end = slice_indices[i], slice_indices[i + 1]
            new_item = copy.copy(item)
            new_item.feature = item.feature[start:end]
            new_item.offsets = [item.offsets[i]]
            new_item.model_specific_data = _slice_model_data(item.model_specific_data, i, start, end,
                                                             num_items, feature_len)
            new_item.hash = None
            expanded.append(new_item)
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


# --------------------------------------------------------------------------------------------------------
# The embedding cache: keyed by item hash (per image after the split, per request when bundled)
# --------------------------------------------------------------------------------------------------------


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
    """An unbounded hash -> embedding cache (SGLang's multimodal embedding cache without eviction)."""

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


# --------------------------------------------------------------------------------------------------------
# Transport
# --------------------------------------------------------------------------------------------------------


def send_pyobj(obj: Any) -> bytes:
    """ZMQ ``send_pyobj``: ``pickle.dumps`` (a CUDA tensor goes by value, with its device)."""
    return pickle.dumps(obj)


def recv_pyobj(data: bytes) -> Any:
    """ZMQ ``recv_pyobj``: ``pickle.loads`` (a CUDA tensor comes back on the device it was saved from)."""
    return pickle.loads(data)


def ipc_dumps(obj: Any) -> bytes:
    """What a ``torch.multiprocessing`` queue sends: ``ForkingPickler`` with torch's reducers.

    A CUDA tensor becomes a CUDA IPC handle; ``pickle.loads`` on the receiver opens it on its device.
    The sender must keep the tensor alive until the receiver is done with it. CPU tensors are shared through
    named shared memory (the ``file_system`` strategy), so the bytes can travel over any socket.
    """
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing as tmp  # registers the tensor reducers

    tmp.set_sharing_strategy("file_system")

    buf = io.BytesIO()
    ForkingPickler(buf, pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def broadcast_pyobj(data: list[Any], rank: int, dist_group, src: int = 0) -> list[Any]:
    """``srt/utils/common.py`` ``broadcast_pyobj`` with ``force_cpu_device=True`` (the gloo CPU group).

    ``rank`` is the global rank of the caller; ``src`` the global rank that holds ``data``.
    """
    import torch.distributed as dist

    if rank == src:
        if len(data) == 0:
            dist.broadcast(torch.tensor([0], dtype=torch.long), src=src, group=dist_group)
            return data
        serialized = pickle.dumps(data)
        tensor_data = torch.ByteTensor(np.frombuffer(serialized, dtype=np.uint8))
        dist.broadcast(torch.tensor([len(serialized)], dtype=torch.long), src=src, group=dist_group)
        dist.broadcast(tensor_data, src=src, group=dist_group)
        return data
    tensor_size = torch.tensor([0], dtype=torch.long)
    dist.broadcast(tensor_size, src=src, group=dist_group)
    size = int(tensor_size.item())
    if size == 0:
        return []
    tensor_data = torch.empty(size, dtype=torch.uint8)
    dist.broadcast(tensor_data, src=src, group=dist_group)
    return pickle.loads(tensor_data.numpy().tobytes())


def tensor_devices(obj: dict) -> dict[str, str]:
    """Device string of every tensor value in a processor output, e.g. ``{"grid_thws": "cuda:0"}``."""
    return {k: str(v.device) for k, v in obj.items() if isinstance(v, torch.Tensor)}


def grid_key(obj: dict) -> str | None:
    """Which grid key a processor output carries: ``"grid_thws"`` (before) or ``"image_grid_thw"``."""
    for key in ("image_grid_thw", "grid_thws"):
        if key in obj:
            return key
    return None


# --------------------------------------------------------------------------------------------------------
# Synthetic inputs (seeded)
# --------------------------------------------------------------------------------------------------------


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
