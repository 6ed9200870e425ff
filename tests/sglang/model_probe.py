"""A probe (a test's, run in a release's worker): what the release's own ``ModelConfig`` and
tokenizer make of a model folder the engine harness builds."""

import tempfile
from pathlib import Path

from sglab.sglang.engine.model import prepare_model


def probe_model_config(prepared, params: dict) -> list[dict]:
    """Rows of what the release's own ``ModelConfig`` decides for the model folder built from
    ``params["config"]``."""
    from sglang.srt.configs.model_config import ModelConfig

    with tempfile.TemporaryDirectory(prefix="sglab-model-") as tmp:
        folder = prepare_model(Path(params["config"]), Path(tmp) / "model")
        mc = ModelConfig(model_path=str(folder), trust_remote_code=False)
        keys = ("is_multimodal", "is_hybrid_swa", "attention_arch", "num_hidden_layers",
                "context_len", "vocab_size", "hidden_size", "swa_attention_layer_ids",
                "full_attention_layer_ids", "sliding_window_size", "kv_lora_rank")
        out = []
        for k in keys:
            v = getattr(mc, k, None)
            out.append({
                "metric": k,
                "value": v if isinstance(v, (int, float, bool, str, list, type(None))) else str(v)
            })
        out.append({"metric": "architecture", "value": mc.hf_config.architectures[0]})
        from sglang.srt.utils.hf_transformers_utils import get_tokenizer

        tok = get_tokenizer(str(folder))
        out.append({"metric": "tokenizer", "value": f"{type(tok).__name__} {len(tok)}"})
        out.append({
            "metric": "tokenizer_ids", "value": tok.encode("t7 t31999 t4", add_special_tokens=False)
        })
        return out
