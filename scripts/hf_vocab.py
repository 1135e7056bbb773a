"""A Hugging Face tokenizer folder (tokenizer.json + tokenizer_config.json) as the vocabulary a
GGUF holds, with convert_hf_to_gguf.py's rules: added tokens that are special or look like <|...|>
are CONTROL (3), other added tokens USER_DEFINED (4), the rest NORMAL (1). Used by
scripts/bench_serve_host.py (reflex's Tokenizer from the metadata) and tests/test_tokenizer.py (a
GGUF file of it)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass
class HfVocab:
    tokens: list[str]
    types: list[int]
    merges: list[str]
    ids: dict[str, int]
    config: dict  # tokenizer_config.json


def read_hf_vocab(folder) -> HfVocab:
    folder = Path(folder)
    spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    added = {t["id"]: t for t in spec["added_tokens"]}
    vocab = spec["model"]["vocab"]
    n = max(max(vocab.values()), max(added)) + 1
    tokens, types = [""] * n, [1] * n
    for text, token_id in vocab.items():
        tokens[token_id] = text
    for token_id, entry in added.items():
        text = tokens[token_id] = entry["content"]
        looks_special = text.startswith("<|") and text.endswith("|>")
        types[token_id] = 3 if entry["special"] or looks_special else 4
    merges = [" ".join(m) if isinstance(m, list) else m for m in spec["model"]["merges"]]
    return HfVocab(tokens, types, merges, {t: i for i, t in enumerate(tokens)}, config)
