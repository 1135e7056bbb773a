"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): configuration from GGUF.

Per layer: RMSNorm -> attention exactly as Qwen3 dense (q/k/v, per-head RMSNorm on q and k, NeoX
RoPE, causal GQA) -> residual; RMSNorm -> sparse MoE FFN -> residual:
  router   p = softmax(ffn_gate_inp @ h) over all experts (float32)
  select   the top `expert_used_count` experts by p; equal p goes to the lower expert id
  weights  the selected p, divided by their sum (norm_topk_prob), the sum clamped to >= 2^-14
  experts  expert e: ffn_down_exps[e] @ (silu(ffn_gate_exps[e] @ h) * (ffn_up_exps[e] @ h))
  output   sum over the selected experts of weight * expert output
Every layer is sparse (llama.cpp has no dense layers for this architecture). LM head as Qwen3.

Tensors (ggml order, shape[0] contiguous): ffn_gate_inp {n_embd, n_expert}; ffn_gate_exps and
ffn_up_exps {n_embd, n_ff_exp, n_expert}; ffn_down_exps {n_ff_exp, n_embd, n_expert}: in numpy
order each is a stack of per-expert (out, in) matrices.

What llama.cpp takes from the file and what it hard-codes (we follow it, so files mean the same):
- `expert_count`, `expert_used_count` (required), `expert_feed_forward_length` (default
  feed_forward_length / expert_used_count);
- the router is always softmax and the top-k weights are always renormalized: the converter
  writes no norm_topk_prob, and llama.cpp ignores `expert_gating_func`,
  `expert_weights_norm` and `expert_weights_scale` for qwen3moe (a model trained with
  norm_topk_prob=False is run renormalized, by llama.cpp and by us).
"""

from __future__ import annotations

import array

from ...errors import ModelFileError
from ...modelfile.gguf_file import printable
from ..config import (MAX_EXPERTS, MAX_WIDTH, MetadataReader, ModelConfig, attention_shapes, check_shapes,
                      check_tensor_types, head_shapes)
from ..qwen3.config import qwen3_config


def _uniform_int(md: MetadataReader, key: str, default: int | None = None, *, hi: int) -> int | None:
    """An integer key that llama.cpp also accepts as a per-layer array: one value for every layer."""
    v = md.gguf.arch_get(key)
    if not isinstance(v, (list, array.array)):  # absent, or a scalar: MetadataReader checks it
        return md.int(key, default, required=default is None, hi=hi)
    values = set(md.ints(key, len(v), hi=hi))
    if len(values) != 1:
        raise md.bad(key, "one integer for every layer", v)
    return values.pop()


def _check_expert_tensors(gguf, n_layers: int, n_embd: int, n_expert: int, n_ff_exp: int) -> None:
    want = {
        "ffn_gate_inp": (n_embd, n_expert),
        "ffn_gate_exps": (n_embd, n_ff_exp, n_expert),
        "ffn_up_exps": (n_embd, n_ff_exp, n_expert),
        "ffn_down_exps": (n_ff_exp, n_embd, n_expert),
    }
    for il in range(n_layers):
        for kind, shape in want.items():
            ti = gguf.tensor(f"blk.{il}.{kind}.weight")  # ModelFileError naming it when absent
            if tuple(ti.shape) != shape:
                raise ModelFileError(
                    f"GGUF tensor '{ti.name}' has shape {tuple(ti.shape)}, expected {shape} "
                    f"(n_embd {n_embd}, n_ff_exp {n_ff_exp}, n_expert {n_expert}): {printable(gguf.path, 1024)}")


def config_from_gguf(gguf) -> ModelConfig:
    check_tensor_types(gguf)
    md = MetadataReader(gguf)
    n_layers = md.layers()
    n_embd = md.int("embedding_length", required=True, lo=1, hi=MAX_WIDTH)
    n_expert = md.int("expert_count", required=True, lo=1, hi=MAX_EXPERTS)
    n_used = _uniform_int(md, "expert_used_count", hi=MAX_EXPERTS)
    if not 0 < n_used <= n_expert:
        raise ModelFileError(
            f"GGUF has expert_count {n_expert} and expert_used_count {n_used}; need 0 < used <= count: "
            f"{printable(gguf.path, 1024)}")
    n_ff = md.int("feed_forward_length", 0, hi=MAX_WIDTH) or 0
    n_ff_exp = _uniform_int(md, "expert_feed_forward_length", 0, hi=MAX_WIDTH) or n_ff // n_used
    if n_ff_exp <= 0:
        raise ModelFileError(f"GGUF has no expert_feed_forward_length (nor feed_forward_length): {printable(gguf.path, 1024)}")
    _check_expert_tensors(gguf, n_layers, n_embd, n_expert, n_ff_exp)
    config = qwen3_config(gguf, md, n_ff=n_ff or n_ff_exp, n_layers=n_layers, extra={
        "n_expert": n_expert,
        "n_expert_used": n_used,
        "n_ff_exp": n_ff_exp,
        "norm_topk_prob": True,  # llama.cpp hard-codes it for qwen3moe (see above)
    })
    want = head_shapes(config)
    for il in range(n_layers):
        want.update(attention_shapes(config, il, gguf))
        want[f"blk.{il}.ffn_norm.weight"] = (n_embd,)
    check_shapes(gguf, want, config.arch)
    return config
