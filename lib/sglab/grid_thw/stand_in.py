"""Kimi-K2.5's Hugging Face processor, made here, so that 05's real engine runs offline: tokenizer,
image processor (type-checked only), ``media_proc_cfg``, token calculator and a CPU ``__call__``.
:data:`PROCESSOR` hands it to the release for a ``kimi_k25`` folder; the rest is the release's own.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

from sglab.core import lazy
from sglab.sglang.engine import adjustment


rebuild = lazy.Module("sglab.grid_thw.rebuild")  # torch: only where a processor is made
# Kimi's media tokens, in id order, ending at the config's media_placeholder_token_id
MEDIA_TOKENS = ("<|media_start|>", "<|media_content|>", "<|media_end|>", "<|media_pad|>")


def media_proc_cfg() -> dict:
    """Kimi-K2.5's ``media_proc_cfg``, the rebuild's values."""
    return dict(patch_size=rebuild.PATCH_SIZE, merge_kernel_size=rebuild.MERGE_KERNEL_SIZE,
                in_patch_limit=rebuild.IN_PATCH_LIMIT,
                patch_limit_on_one_side=rebuild.PATCH_LIMIT_ON_ONE_SIDE, fixed_output_tokens=None,
                image_mean=list(rebuild.IMAGE_MEAN), image_std=list(rebuild.IMAGE_STD))


def media_token_ids(config: dict) -> dict[str, int]:
    """``{token: id}`` of the media tokens, ``<|media_pad|>`` at ``media_placeholder_token_id``."""
    pad = int(config["media_placeholder_token_id"])
    return {t: pad - len(MEDIA_TOKENS) + 1 + i for i, t in enumerate(MEDIA_TOKENS)}


def tokenizer_json(folder: Path, config: dict) -> dict:
    """The folder's ``tokenizer.json`` with the media tokens as special tokens at their ids."""
    tok = json.loads((Path(folder) / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    by_id = {i: w for w, i in vocab.items()}
    for t, i in media_token_ids(config).items():
        if by_id.get(i) is None:
            raise ValueError(f"{folder}: the tokenizer has no id {i} for {t}")
        del vocab[by_id[i]]
        vocab[t] = i
        tok["added_tokens"].append(
            dict(id=i, content=t, single_word=False, lstrip=False, rstrip=False, normalized=False,
                 special=True))
    return tok


class MediaProcessor:
    """``media_processor`` of Kimi's processor: its config, and the token count of one image."""

    def __init__(self):
        self.media_proc_cfg = media_proc_cfg()

    def media_tokens_calculator(self, media: dict) -> int:
        w, h = media["image"].size
        return rebuild.navit_resize_config(w, h)["num_tokens"]


class Processor:
    """The stand-in for Kimi-K2.5's ``KimiK25Processor``."""

    def __init__(self, tokenizer):
        from transformers.image_processing_utils import BaseImageProcessor

        self.tokenizer = tokenizer
        self.image_processor = BaseImageProcessor()
        self.media_processor = MediaProcessor()

    def __call__(self, text=None, medias=None, **kwargs):
        """Without CUDA: tokens, and the rebuild's preprocessing on the CPU (``grid_thws``)."""
        import numpy as np
        import torch

        out = dict(self.tokenizer(text, return_tensors="pt"))
        if medias:
            rgb = (np.asarray(m["image"].convert("RGB")) for m in medias)
            images = [torch.from_numpy(a).permute(2, 0, 1) for a in rgb]
            pixels, grid, _ = rebuild.gpu_preprocess_images(images, "cpu")
            out.update(pixel_values=pixels, grid_thws=grid)
        return out


def processor(folder, config: dict) -> Processor:
    """The stand-in processor of a model folder written by ``sglab engine``."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer.from_str(json.dumps(tokenizer_json(folder, config)))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>")
    return Processor(fast)


def use_stand_in(params: dict, module) -> None:
    """Patch ``module.get_processor`` to return :func:`processor` for a ``kimi_k25`` folder."""
    from sglab.sglang.engine.hooks import say

    original = module.get_processor

    @functools.wraps(original)
    def get_processor(tokenizer_name, *args, **kwargs):
        cfg_path = Path(str(tokenizer_name)) / "config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        if cfg.get("model_type") != "kimi_k25":
            return original(tokenizer_name, *args, **kwargs)
        return processor(tokenizer_name, cfg)

    module.get_processor = get_processor
    say(f"applied {params['name']} pid={os.getpid()} ({module.__name__}.get_processor: "
        "kimi_k25 folders get sglab's stand-in processor)")


# the shared adjustment (sglab.sglang.engine.spec.ADJUSTMENTS), whose patch is use_stand_in
PROCESSOR = adjustment("kimi-k25-processor-stand-in")
