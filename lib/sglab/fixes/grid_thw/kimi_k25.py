"""Kimi-K2.5's GPU image preprocessor, before and after SGLang PR #22858.

Upstream: ``python/sglang/srt/multimodal/processors/kimi_k25.py`` — ``navit_resize_config``,
``_process_single_image``, ``_gpu_preprocess_images`` and ``KimiGPUProcessorWrapper._gpu_call``. Before the PR
``_gpu_call`` returned ``{"input_ids", "pixel_values", "grid_thws"}`` with both tensors built on ``cuda:0`` in the
tokenizer-manager process; the PR added ``grid_thws = grid_thws.cpu()`` and renamed the key to the SGLang-standard
``"image_grid_thw"`` (first released in SGLang 0.5.11; 0.5.10.post1 has no GPU preprocessor yet).

Why the grid matters at all: it is a few dozen bytes, but it is a *CUDA* tensor, and whatever process unpickles it
re-creates it on ``cuda:0`` (see :mod:`.transport`). Everything here also runs on the CPU (``device="cpu"``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

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
