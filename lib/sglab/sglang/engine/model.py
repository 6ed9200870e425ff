"""The model folder an engine loads offline: the shipped ``config.json``, a WordLevel tokenizer
written here (one word per id of the model's vocabulary, at least 32,000), and no weights
(``--load-format dummy``)."""

from __future__ import annotations

import json
from pathlib import Path

from sglab.sglang.engine.spec import EngineError, VOCAB, read_config


def tokenizer_json(vocab: int = VOCAB) -> dict:
    """A WordLevel tokenizer's JSON: ``<unk> <s> </s> <pad>``, then ``t4`` ... ``t{vocab-1}``."""
    special = ["<unk>", "<s>", "</s>", "<pad>"]
    words = {tok: i for i, tok in enumerate(special)}
    words.update({f"t{i}": i for i in range(len(special), vocab)})
    added = [
        dict(id=i, content=tok, single_word=False, lstrip=False, rstrip=False, normalized=False,
             special=True) for i, tok in enumerate(special)
    ]
    return dict(version="1.0", truncation=None, padding=None, added_tokens=added, normalizer=None,
                pre_tokenizer={"type": "WhitespaceSplit"}, post_processor=None, decoder=None,
                model={"type": "WordLevel", "vocab": words, "unk_token": "<unk>"})


TOKENIZER_CONFIG = dict(tokenizer_class="PreTrainedTokenizerFast", unk_token="<unk>",
                        bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                        model_max_length=131072, clean_up_tokenization_spaces=False)


def prepare_model(config: Path, dest: Path) -> Path:
    """``dest`` as a model folder SGLang loads offline with dummy weights."""
    cfg = read_config(config)
    vocab = int(cfg.text.get("vocab_size") or cfg.data.get("vocab_size") or VOCAB)
    if vocab < VOCAB:
        raise EngineError(
            f"{config}: vocab_size {vocab} is below the harness tokenizer's {VOCAB} tokens")
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_bytes(cfg.raw)
    (dest / "tokenizer.json").write_text(json.dumps(tokenizer_json(vocab)))
    (dest / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG, indent=1))
    return dest
