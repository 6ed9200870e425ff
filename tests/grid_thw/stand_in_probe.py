"""A probe (run by ``sglab.sglang.runner`` in one release's worker, on the CPU) of 05's stand-in
processor: the release's own ``get_processor`` with :data:`sglab.grid_thw.stand_in.PROCESSOR`
applied, on a model folder written as ``sglab engine`` writes it, then its
``MultimodalSpecialTokens`` and ``KimiGPUProcessorWrapper._gpu_call`` on that processor."""

from __future__ import annotations

import json
from pathlib import Path

from sglab.grid_thw import rebuild
from sglab.grid_thw.stand_in import PROCESSOR, media_token_ids, use_stand_in


def probe(prepared, params: dict) -> list[dict]:
    """Rows ``metric, value`` (the normalisation tensors on the CPU, a synthetic image)."""
    import tempfile

    import torch

    from sglab.sglang import bootstrap
    from sglab.sglang import engine as eng

    mod = bootstrap.import_release_module(prepared, PROCESSOR.param_dict()["module"])
    use_stand_in({"name": PROCESSOR.name}, mod)
    base = bootstrap.import_release_module(prepared,
                                           "sglang.srt.multimodal.processors.base_processor")
    kimi = bootstrap.import_release_module(prepared, "sglang.srt.multimodal.processors.kimi_k25")
    with tempfile.TemporaryDirectory(prefix="sglab-kimi-") as tmp:
        folder = eng.prepare_model(Path(params["config"]), Path(tmp) / "model")
        proc = mod.get_processor(str(folder), trust_remote_code=False)
    cfg = json.loads(Path(params["config"]).read_text())
    tokens = base.MultimodalSpecialTokens(
        image_token="<|media_pad|>", image_token_id=cfg["media_placeholder_token_id"]).build(proc)
    m = proc.media_processor.media_proc_cfg
    w = kimi.KimiGPUProcessorWrapper(
        proc, image_token=tokens.image_token, patch_size=m["patch_size"],
        merge_kernel_size=m["merge_kernel_size"], in_patch_limit=m["in_patch_limit"],
        patch_limit_on_one_side=m["patch_limit_on_one_side"],
        fixed_output_tokens=m.get("fixed_output_tokens"), image_mean=m["image_mean"],
        image_std=m["image_std"])
    w._get_gpu_norm_tensors(device="cpu")
    image = rebuild.synthetic_image(0)
    out = w._gpu_call(params["prompt"], [image])
    ids = out["input_ids"][0].tolist()
    pad = cfg["media_placeholder_token_id"]
    facts = {
        "processor": type(proc).__name__, "image_token_id": tokens.image_token_id,
        "media_token_ids": [
            ids[i]
            for i in range(len(ids)) if ids[i] in media_token_ids(cfg).values() and ids[i] != pad
        ], "image_tokens": ids.count(pad), "expected_image_tokens": rebuild.navit_resize_config(
            image.shape[2], image.shape[1])["num_tokens"], "max_id": max(ids),
        "vocab_size": cfg["text_config"]["vocab_size"], "grid": out["image_grid_thw"].tolist(),
        "grid_device": str(out["image_grid_thw"].device),
        "pixel_values": list(out["pixel_values"].shape), "pixel_values_finite": bool(
            torch.isfinite(out["pixel_values"]).all()), "tokenized": proc.tokenizer(
                "<|media_start|>image<|media_content|><|media_pad|><|media_end|> t7")["input_ids"],
        "tokenizer_size": len(proc.tokenizer)
    }
    return [{"metric": k, "value": v} for k, v in facts.items()]
