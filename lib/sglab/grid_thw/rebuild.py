"""The request path of a Kimi-K2.5 image request, before and after SGLang #22858, one section per
upstream file in the order a request meets them. The switch is ``fixed`` of :func:`gpu_call`:
before, the grid stays where it was built under Kimi's key ``grid_thws``; after, ``.cpu()`` under
SGLang's ``image_grid_thw``. Everything runs on the CPU too; nothing here measures.
"""

from __future__ import annotations

import copy
import hashlib
import io
import pickle
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

# -- 1. srt/multimodal/processors/kimi_k25.py · navit_resize_config, _gpu_preprocess_images,
#    KimiGPUProcessorWrapper._gpu_call (the fix)
# Kimi-K2.5 media_proc_cfg values
PATCH_SIZE, MERGE_KERNEL_SIZE, IN_PATCH_LIMIT, PATCH_LIMIT_ON_ONE_SIDE = 14, 2, 16384, 512
IMAGE_MEAN = IMAGE_STD = (0.5, 0.5, 0.5)
IMAGE_TOKEN_ID = 163605  # <|media_pad|> in Kimi's tokenizer (hf_config.media_placeholder_token_id)


def navit_resize_config(width: int, height: int, patch_size: int = PATCH_SIZE,
                        merge_kernel_size: int = MERGE_KERNEL_SIZE,
                        in_patch_limit: int = IN_PATCH_LIMIT,
                        patch_limit_on_one_side: int = PATCH_LIMIT_ON_ONE_SIDE) -> dict:
    """NaViT target size and token count (pure math)."""
    s1 = (in_patch_limit / (max(1.0, width // patch_size) * max(1.0, height // patch_size)))**0.5
    s2 = patch_limit_on_one_side * patch_size / width
    s3 = patch_limit_on_one_side * patch_size / height
    scale = min(1.0, s1, s2, s3)
    new_w = min(max(1, int(width * scale)), patch_limit_on_one_side * patch_size)
    new_h = min(max(1, int(height * scale)), patch_limit_on_one_side * patch_size)
    factor = merge_kernel_size * patch_size
    pad_h = (factor - new_h % factor) % factor
    pad_w = (factor - new_w % factor) % factor
    num_tokens = ((new_h + pad_h) // factor) * ((new_w + pad_w) // factor)
    return {
        "num_tokens": num_tokens, "new_width": new_w, "new_height": new_h, "pad_width": pad_w,
        "pad_height": pad_h
    }


def _process_single_image(image, config: dict, image_mean, image_std_inv, patch_size: int):
    """One (C, H, W) uint8 image -> patches and its [t, h, w] grid, on the image's device."""
    x = image.unsqueeze(0).float()
    x = F.interpolate(x, size=(config["new_height"], config["new_width"]), mode="bicubic",
                      align_corners=False)
    if config["pad_height"] > 0 or config["pad_width"] > 0:
        x = F.pad(x, (0, config["pad_width"], 0, config["pad_height"]), value=0.0)
    x = (x / 255.0 - image_mean) * image_std_inv
    _, C, H, W = x.shape
    T, gh, gw = 1, H // patch_size, W // patch_size
    x = x.view(T, C, gh, patch_size, gw, patch_size)
    x = x.permute(0, 2, 4, 1, 3, 5).reshape(-1, C, patch_size, patch_size)
    return x, torch.tensor([T, gh, gw], dtype=torch.int64, device=x.device)


def gpu_preprocess_images(images: list, device, patch_size: int = PATCH_SIZE):
    """``_gpu_preprocess_images`` (one image at a time; upstream batches equal sizes, same result):
    ``pixel_values`` (all patches, 3, p, p) and ``grid_thws`` (n_images, 3) int64, both on
    ``device``, and the resize configs (for the token expansion)."""
    device = torch.device(device)
    mean = torch.tensor(IMAGE_MEAN, device=device, dtype=torch.float32).view(1, 3, 1, 1)
    std_inv = (1.0 / torch.tensor(IMAGE_STD, device=device, dtype=torch.float32)).view(1, 3, 1, 1)
    configs, patches, grids = [], [], []
    for image in images:
        config = navit_resize_config(image.shape[2], image.shape[1], patch_size)
        p, g = _process_single_image(image.to(device), config, mean, std_inv, patch_size)
        configs.append(config)
        patches.append(p)
        grids.append(g)
    return torch.cat(patches, dim=0), torch.stack(grids, dim=0), configs


def gpu_call(prompt_ids: list[int], images: list, *, fixed: bool, device="cuda:0") -> dict:
    """``KimiGPUProcessorWrapper._gpu_call``, before (``fixed=False``) or after (``fixed=True``)
    the PR. ``prompt_ids`` holds one ``IMAGE_TOKEN_ID`` per image, expanded to each image's token
    count (upstream expands the text, then tokenizes: the same ids)."""
    pixel_values, grid_thws, configs = gpu_preprocess_images(images, device)
    input_ids: list[int] = []
    it = iter(configs)
    for tok in prompt_ids:
        input_ids.extend([IMAGE_TOKEN_ID] * next(it)["num_tokens"] if tok ==
                         IMAGE_TOKEN_ID else [tok])
    input_ids_t = torch.tensor([input_ids], dtype=torch.int64)
    if not fixed:  # before: the grid stays where it was built, under Kimi's own key
        return {"input_ids": input_ids_t, "pixel_values": pixel_values, "grid_thws": grid_thws}
    grid_thws = grid_thws.cpu()  # the fix: the grid to the CPU, under the SGLang-standard key
    return {"input_ids": input_ids_t, "pixel_values": pixel_values, "image_grid_thw": grid_thws}


# -- 2. srt/managers/schedule_batch.py · MultimodalDataItem (the fields used here) -----------------
@dataclass
class MMItem:
    """``hash`` keys the embedding cache: one hash per image once the item is split, one over all
    of a request's pixels while it stays bundled."""

    modality: str
    feature: Any = None
    offsets: list | None = None
    model_specific_data: dict = field(default_factory=dict)
    hash: int | None = None

    def is_image(self) -> bool:
        return self.modality == "image"

    def set_hash(self) -> int:
        """``set_pad_value``: hash the feature (``mm_utils.hash_feature``) once."""
        if self.hash is None:
            self.hash = hash_feature(self.feature)
        return self.hash


# -- 3. srt/managers/mm_utils.py · get_new_expanded_mm_items, data_hash, hash_feature --------------
# The split looks up `image_grid_thw` by name. Under Kimi's old key `grid_thws` it finds nothing,
# the simple split does not apply (many patches per image), and the request stays one bundled item
# whose hash covers all its pixels: an image seen before in other company never hits the cache.
def _get_length(value) -> int | None:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return value.shape[0] if value.ndim > 0 else None
    if isinstance(value, (list, tuple)):
        return len(value)
    return None


def _sliced_item(item: MMItem, i: int, start: int, end: int, num_items: int,
                 feature_len: int | None) -> MMItem:
    new = copy.copy(item)
    new.feature, new.offsets, new.hash = item.feature[start:end], [item.offsets[i]], None
    data = {}
    for key, value in item.model_specific_data.items():
        length = _get_length(value)
        data[key] = (value[i:i + 1] if length == num_items else value[start:end]
                     if feature_len is not None and length == feature_len else value)
    new.model_specific_data = data
    return new


def _try_simple_split(item: MMItem, num_items: int, out: list) -> bool:
    """Split only when the feature has exactly one row per offset."""
    if _get_length(item.feature) != num_items:
        return False
    out.extend(_sliced_item(item, i, i, i + 1, num_items, None) for i in range(num_items))
    return True


def _split_by_grid(item: MMItem, image_grid_thw, num_items: int) -> list | None:
    """Slice the feature by each image's t·h·w patches (None when they miss the feature's rows)."""
    per_item = [
        int(torch.prod(torch.as_tensor(g, dtype=torch.long)).item()) for g in image_grid_thw
    ]
    bounds = [0] + torch.cumsum(torch.tensor(per_item, dtype=torch.long), dim=0).tolist()
    feature_len = _get_length(item.feature)
    if feature_len is None or bounds[-1] != feature_len:
        return None
    return [
        _sliced_item(item, i, bounds[i], bounds[i + 1], num_items, feature_len)
        for i in range(num_items)
    ]


def get_new_expanded_mm_items(original_mm_items: list) -> list:
    """The image branch: one item per image, by ``image_grid_thw``."""
    expanded: list = []
    for item in original_mm_items:
        if not (item.offsets is not None and len(item.offsets) > 1 and item.is_image()):
            expanded.append(item)
            continue
        num_items = len(item.offsets)
        grid = item.model_specific_data.get("image_grid_thw")
        if grid is None or _get_length(grid) != num_items:
            if not _try_simple_split(item, num_items, expanded):
                expanded.append(item)
            continue
        split = _split_by_grid(item, grid, num_items)
        expanded.extend(split if split is not None else [item])
    return expanded


def data_hash(data: bytes) -> int:
    """The first 8 bytes of SHA-256, big-endian unsigned."""
    return int.from_bytes(hashlib.sha256(data).digest()[:8], byteorder="big", signed=False)


def hash_feature(feature: torch.Tensor) -> int:
    """``hash_feature`` -> ``tensor_hash`` for a CPU tensor."""
    t = feature.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return data_hash(memoryview(t.numpy()).tobytes())


# -- 4. srt/multimodal/processors/base_processor.py · FEATURE_NAMES, process_mm_data,
#    collect_mm_items_from_processor_output, get_mm_items_offset, process_and_combine_mm_data
# FEATURE_NAMES is an allow-list: a model-specific processor's other tensor escapes it, which is how
# a 32-byte grid reached every TP rank on cuda:0. ("grid_thws": for kimi k2.5.)
FEATURE_NAMES = ["pixel_values", "pixel_values_videos", "audio_features", "input_features"]
ATTR_NAME_TO_MODALITY = {
    "pixel_values": "image", "image_grid_thw": "image", "grid_thws": "image",
    "pixel_values_videos": "video", "video_grid_thw": "video", "audio_features": "audio",
    "input_features": "audio"
}


def offload_features(result: dict, feature_names=FEATURE_NAMES) -> dict:
    """The tail of ``process_mm_data``: move only the ``FEATURE_NAMES`` to the CPU."""
    for name in feature_names:
        if name in result and isinstance(result[name], torch.Tensor):
            result[name] = result[name].to("cpu")
    return result


def process_mm_data(prompt_ids: list[int], images: list, *, fixed: bool, device="cuda:0") -> dict:
    """What the tokenizer manager ships: ``_gpu_call``, then the ``FEATURE_NAMES`` offload."""
    return offload_features(gpu_call(prompt_ids, images, fixed=fixed, device=device))


def collect_mm_items(result: dict) -> list[MMItem]:
    """``collect_mm_items_from_processor_output``: one bundled item per modality; feature tensors
    become ``feature``, the rest model-specific data."""
    items: dict[str, MMItem] = {}
    for attr, value in result.items():
        modality = ATTR_NAME_TO_MODALITY.get(attr)
        if attr == "input_ids" or modality is None:
            continue
        item = items.setdefault(modality, MMItem(modality=modality))
        if attr in FEATURE_NAMES:
            item.feature = value
        else:
            item.model_specific_data[attr] = value
    return list(items.values())


def get_mm_items_offset(input_ids: torch.Tensor, mm_token_id: int) -> list[tuple[int, int]]:
    """(start, end) of each run of ``mm_token_id``."""
    mask = input_ids == mm_token_id
    start = (mask & ~torch.roll(mask, 1)).nonzero(as_tuple=True)[0]
    end = (mask & ~torch.roll(mask, -1)).nonzero(as_tuple=True)[0]
    return list(zip(start.tolist(), end.tolist()))


def items_for_request(result: dict) -> list[MMItem]:
    """``process_and_combine_mm_data``: collect items, set offsets, split per image, hash each."""
    input_ids = result["input_ids"].flatten()
    items = collect_mm_items(result)
    for item in items:
        if item.offsets is None:
            item.offsets = get_mm_items_offset(input_ids, IMAGE_TOKEN_ID)
    items = get_new_expanded_mm_items(items)
    for item in items:
        item.set_hash()
    return items


# -- 5. srt/mem_cache/multimodal_cache.py · MultiModalStaticCache, as mm_utils uses it (0.5.11) ----
# When every item has one offset (split per image) `_get_chunked_embedding_by_item` looks each image
# up by its own hash and encodes only the misses; otherwise `_get_chunked_embedding_full` looks the
# request up by the combined hash of its items. Here: unbounded (no LRU), one lookup per item.
@dataclass
class CacheStats:
    lookups: int = 0  # items looked up in the cache
    hits: int = 0  # items found
    images: int = 0  # images in all requests
    images_encoded: int = 0  # images the vision tower had to encode (those of missed items)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    @property
    def image_hit_rate(self) -> float:
        return 1.0 - self.images_encoded / self.images if self.images else 0.0


class EmbeddingCache:
    """hash -> embedding (only who would be encoded; no embedding is computed)."""

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


# -- 6. the hop to every TP rank: ZMQ send_pyobj / recv_pyobj, srt/utils/common.py ·
#    broadcast_pyobj; a torch.multiprocessing queue (CUDA IPC) for comparison
# Plain pickle writes a CUDA tensor by value with its device (the storage goes through torch.save's
# location tag), so pickle.loads re-creates it on cuda:0 in whichever process unpickles it: a whole
# CUDA context on GPU 0 for a 32-byte grid. A CUDA IPC handle is opened on the tensor's device too.
def send_pyobj(obj) -> bytes:
    """ZMQ ``send_pyobj``: ``pickle.dumps`` (a CUDA tensor goes by value, with its device)."""
    return pickle.dumps(obj)


def recv_pyobj(data: bytes):
    """ZMQ ``recv_pyobj``: ``pickle.loads`` (a CUDA tensor comes back on its saved device)."""
    return pickle.loads(data)


def ipc_dumps(obj) -> bytes:
    """What a ``torch.multiprocessing`` queue sends: ``ForkingPickler`` with torch's reducers. A
    CUDA tensor becomes an IPC handle the receiver opens on its device (the sender keeps it alive
    until then); CPU tensors go through named shared memory (``file_system``)."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing as tmp  # registers the tensor reducers

    tmp.set_sharing_strategy("file_system")
    buf = io.BytesIO()
    ForkingPickler(buf, pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


@dataclass(frozen=True)
class Wire:
    """One serialisation of the tokenizer -> scheduler hop (``dumps`` sends, ``loads`` receives)."""

    dumps: Callable[[Any], bytes]
    loads: Callable[[bytes], Any]
    per_receiver: bool = False  # one dump per receiver (an IPC dump counts one reference)


PICKLE = Wire(send_pyobj, recv_pyobj)  # by value with its device; re-created there
CUDA_IPC = Wire(ipc_dumps, recv_pyobj, per_receiver=True)  # an IPC handle, opened on its device


def broadcast_pyobj(data: list, rank: int, dist_group, src: int = 0) -> list:
    """``broadcast_pyobj`` with ``force_cpu_device=True`` (the gloo CPU group): pickle, two
    broadcasts (size, bytes), ``pickle.loads``. ``rank``: the caller's global rank."""
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
    size = torch.tensor([0], dtype=torch.long)
    dist.broadcast(size, src=src, group=dist_group)
    if int(size.item()) == 0:
        return []
    tensor_data = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.broadcast(tensor_data, src=src, group=dist_group)
    return pickle.loads(tensor_data.numpy().tobytes())


def grid_key(obj: dict) -> str | None:
    """The grid key a processor output carries: ``grid_thws`` (before) or ``image_grid_thw``."""
    return next((k for k in ("image_grid_thw", "grid_thws") if k in obj), None)


# -- 7. the inputs (no upstream counterpart): seeded images, prompts, request streams --------------
def synthetic_image(image_id: int, *, base: int = 28) -> torch.Tensor:
    """A deterministic (3, H, W) uint8 image; H and W multiples of 28 (one merge block) to 84."""
    g = torch.Generator().manual_seed(1000 + image_id)
    h = base * int(torch.randint(1, 4, (1,), generator=g))
    w = base * int(torch.randint(1, 4, (1,), generator=g))
    return torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8)


def prompt_for(n_images: int) -> list[int]:
    """Token ids of a short chat prompt with ``n_images`` image placeholders."""
    return [1, 2, 3] + [IMAGE_TOKEN_ID, 4] * n_images + [5]


def request_stream(n_requests: int, pool_size: int, max_images: int, seed: int) -> list[list[int]]:
    """Seeded multi-image requests, each 1..``max_images`` distinct images of a pool of
    ``pool_size``: images repeat across requests while whole image sets rarely do."""
    rng = np.random.default_rng(seed)
    return [[
        int(i)
        for i in rng.choice(pool_size, size=int(rng.integers(1, max_images + 1)), replace=False)
    ] for _ in range(n_requests)]
