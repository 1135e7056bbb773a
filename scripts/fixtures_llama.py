"""Llama fixtures: the builder registered in make_fixtures.ARCHS, and the way back from a
(quantized) GGUF into a transformers model.

What llama.cpp's converter (LlamaModel) does for this architecture:
- q and k rows are permuted per head so that HF's rotate-half pairs (i, i + d/2) become adjacent
  pairs (2i, 2i + 1): llama.cpp runs `llama` with its "normal" (pairwise) rope. llama_to_hf undoes
  the permutation when GGUF tensors are loaded back into LlamaForCausalLM;
- `rope.dimension_count` = head_dim, `rope.freq_base` = rope_theta;
- Llama 3 rope scaling (rope_type "llama3") is not written as keys but as the tensor
  `rope_freqs.weight`: one divisor per rotation pair, computed from factor, low/high_freq_factor
  and original_max_position_embeddings; linear scaling is written as `rope.scaling.type` linear
  and `rope.scaling.factor`;
- no output.weight when tie_word_embeddings (the LM head is the token embedding);
- a SentencePiece tokenizer.model becomes tokenizer.ggml.model "llama" (Llama 2's layout).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from make_fixtures import ArchBuild

# make_fixtures imports this module to register the builder: import it back only inside the
# functions, so running make_fixtures.py as a script does not create an import cycle.


def build_llama(overrides: dict, hf_dir: Path) -> ArchBuild:
    """Llama (LlamaForCausalLM), tiny: GQA (4 query heads over 2 KV heads), untied LM head as in
    Llama 2 (tie_word_embeddings=True for the Llama 3.2 / SmolLM2 layout), a Llama-2-style
    SentencePiece vocabulary. Sizes are multiples of 256 so every matrix can be K-quantized.
    Two extra overrides (plain numbers, so fixture keys stay hashable):
      rope_llama3=F   Llama 3.1's rope scaling with factor F, low/high_freq_factor 1/4 and an
                      original context of 64 (so the test prompts see all three regimes: pairs
                      kept, divided by F, and smoothed between): the file gets rope_freqs;
      rope_linear=F   linear rope scaling by F (rope.scaling.type linear)."""
    from make_fixtures import ArchBuild, _split_overrides, train_spm
    from transformers import LlamaConfig

    spm_vocab = int(overrides.pop("spm_vocab_size", 512))
    model = train_spm(hf_dir, spm_vocab, user_symbols=(), llama=True)
    import sentencepiece as spm

    n_tokens = spm.SentencePieceProcessor(model_file=str(model)).vocab_size()
    llama3, linear = overrides.pop("rope_llama3", None), overrides.pop("rope_linear", None)
    if llama3 is not None:
        overrides["rope_scaling"] = {"rope_type": "llama3", "factor": float(llama3), "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    elif linear is not None:
        overrides["rope_scaling"] = {"rope_type": "linear", "factor": float(linear)}
    kw = _split_overrides(overrides, dict(
        vocab_size=n_tokens,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        rope_theta=10_000.0,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=1, eos_token_id=2,
    ))
    kw["architectures"] = ["LlamaForCausalLM"]
    if kw["attention_bias"] or kw["mlp_bias"]:
        raise ValueError("llama fixtures have no biases (the reflex llama family refuses them)")
    (hf_dir / "tokenizer_config.json").write_text(json.dumps({
        "add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "tokenizer_class": "LlamaTokenizer",
    }, indent=1))
    return ArchBuild(LlamaConfig(**kw), norm_center=1.0)


def _unpermute(arr, n_head: int):
    """Inverse of the converter's LlamaModel.permute on the rows of a q or k matrix (or bias)."""
    rows = arr.shape[0]
    return arr.reshape(n_head, rows // n_head // 2, 2, *arr.shape[1:]).swapaxes(1, 2).reshape(arr.shape)


def llama_to_hf(gguf_name: str, arr, src):
    """A dequantized GGUF tensor as LlamaForCausalLM holds it: q and k rows un-permuted."""
    if gguf_name.endswith(("attn_q.weight", "attn_q.bias")):
        return _unpermute(arr, int(src.get("llama.attention.head_count")))
    if gguf_name.endswith(("attn_k.weight", "attn_k.bias")):
        n_kv = src.get("llama.attention.head_count_kv")
        return _unpermute(arr, int(n_kv if n_kv is not None else src.get("llama.attention.head_count")))
    return arr
