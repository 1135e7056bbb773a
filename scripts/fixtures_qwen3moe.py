"""Qwen3-MoE fixtures: the builder registered in make_fixtures.ARCHS, and the way back from a
(quantized) GGUF into a transformers model.

What llama.cpp's converter (Qwen3MoeModel, a Qwen2MoeModel) writes for this architecture:
- keys `qwen3moe.expert_count` (num_experts), `qwen3moe.expert_used_count` (num_experts_per_tok),
  `qwen3moe.expert_feed_forward_length` (moe_intermediate_size) besides the dense Qwen3 keys
  (`feed_forward_length` is the unused dense intermediate_size); NOT norm_topk_prob: llama.cpp
  always renormalizes the top-k weights for qwen3moe, so a model with norm_topk_prob=False does
  not survive conversion (the tests show it);
- per layer `ffn_gate_inp` (ggml {n_embd, n_expert}) and the experts stacked in 3-D tensors
  `ffn_gate_exps` / `ffn_up_exps` (ggml {n_embd, n_ff_exp, n_expert}) and `ffn_down_exps`
  (ggml {n_ff_exp, n_embd, n_expert}); transformers' fused `experts.gate_up_proj`
  (n_expert, 2 n_ff_exp, n_embd) is split into gate (first half) and up (second half).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from make_fixtures import ArchBuild

# make_fixtures imports this module to register the builder: import it back only inside the
# functions, so running make_fixtures.py as a script does not create an import cycle.


def build_qwen3moe(overrides: dict, hf_dir: Path) -> ArchBuild:
    """Qwen3-MoE (Qwen3MoeForCausalLM) shaped like Qwen3-30B-A3B but tiny: every layer sparse
    (llama.cpp has no dense layers for qwen3moe), norm_topk_prob on, untied LM head. Sizes are
    multiples of 256 so every matrix, ffn_down_exps included, can be K-quantized. vocab_size
    stays 151936: the converter asserts every tokenizer id fits (see build_qwen3)."""
    from make_fixtures import ArchBuild, _split_overrides, qwen3_tokenizer_dir
    from transformers import Qwen3MoeConfig

    kw = _split_overrides(overrides, dict(
        vocab_size=151936,
        hidden_size=256,
        intermediate_size=512,  # dense FFN size: written to the file, used by no layer
        moe_intermediate_size=512,  # != hidden_size, so a transposed expert matrix cannot pass
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        tie_word_embeddings=False,
        bos_token_id=151643,
        eos_token_id=151645,
    ))
    if kw["decoder_sparse_step"] != 1 or kw["mlp_only_layers"]:
        raise ValueError("llama.cpp's qwen3moe has no dense layers: keep decoder_sparse_step=1, mlp_only_layers=[]")
    kw["architectures"] = ["Qwen3MoeForCausalLM"]
    tok = qwen3_tokenizer_dir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tok / name, hf_dir / name)
    return ArchBuild(Qwen3MoeConfig(**kw), norm_center=1.0)


def hf_qwen3moe_from_gguf(gguf_path, hf_dir, **config_overrides):
    """The float32 Qwen3MoeForCausalLM of hf_dir with every parameter replaced by the
    gguf-py-dequantized tensor of gguf_path (make_fixtures.hf_model_from_gguf, plus the fused
    expert parameters gguf-py's name map does not cover). config_overrides go to
    from_pretrained (e.g. norm_topk_prob=True). Raises if a parameter or a tensor is left over."""
    import gguf
    import numpy as np
    import torch
    from quantize_gguf import _SourceGGUF
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, **config_overrides).eval()
    src = _SourceGGUF(gguf_path)
    n_blocks = int(src.get("qwen3moe.block_count"))
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3MOE, n_blocks)
    tensors = {name: (shape, t, off) for name, shape, t, off in src.tensors}
    used: set[str] = set()

    def load(gname: str) -> np.ndarray:
        if gname not in tensors:
            raise KeyError(f"no GGUF tensor {gname}")
        shape, t, off = tensors[gname]
        used.add(gname)
        arr = gguf.quants.dequantize(src.tensor_bytes(shape, t, off), gguf.GGMLQuantizationType(t))
        return np.array(arr, dtype=np.float32).reshape(tuple(reversed(shape)))

    with torch.no_grad():
        for name, p in model.named_parameters():
            parts = name.split(".")
            if name.endswith("mlp.experts.gate_up_proj"):
                bid = int(parts[2])
                arr = np.concatenate([load(f"blk.{bid}.ffn_gate_exps.weight"), load(f"blk.{bid}.ffn_up_exps.weight")], axis=1)
            elif name.endswith("mlp.experts.down_proj"):
                arr = load(f"blk.{int(parts[2])}.ffn_down_exps.weight")
            else:
                gname = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
                if gname is None:
                    raise KeyError(f"no GGUF tensor for parameter {name}")
                arr = load(gname)
            if arr.shape != tuple(p.shape):  # no reshape: a transposed tensor must not slip through
                raise ValueError(f"{name}: GGUF gives {arr.shape}, the model wants {tuple(p.shape)}")
            p.copy_(torch.from_numpy(arr))
    if set(tensors) - used:
        raise KeyError(f"GGUF tensors not used by the HF model: {sorted(set(tensors) - used)}")
    return model
