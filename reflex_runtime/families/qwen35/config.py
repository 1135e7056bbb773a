"""Qwen3.5 hybrid (`qwen35` dense, `qwen35moe`): configuration from GGUF.

Per layer: RMSNorm -> token mixer -> residual; RMSNorm -> FFN -> residual. The mixer is either
- a Gated DeltaNet ("linear attention", a recurrent layer): x -> attn_qkv -> causal depthwise
  conv1d over the last `ssm.conv_kernel` tokens (its rolling state) -> SiLU -> q, k, v; q and k
  L2-normalized per head, q scaled by 1/sqrt(head_k_dim); per value head a decay
  g = ssm_a * softplus(x @ ssm_alpha + ssm_dt.bias) and a write strength beta =
  sigmoid(x @ ssm_beta) drive the delta rule on a (head_k_dim x head_v_dim) state:
  S <- exp(g) S; S <- S + k (beta (v - S^T k))^T; o = S^T q; then RMSNorm(o) * SiLU(x @ attn_gate)
  per head (ssm_norm) -> ssm_out;
- or gated full attention: attn_q gives per head [query | gate]; per-head RMSNorm on q and k;
  NeoX RoPE on the first `rope.dimension_count` dims; causal GQA; output * sigmoid(gate) ->
  attn_output.
The FFN is SwiGLU (qwen35) or, for qwen35moe, softmax-routed top-k experts (weights
renormalized over the chosen k) plus a shared expert scaled by sigmoid(x @ ffn_gate_inp_shexp).

The converter's conventions (llama.cpp conversion/qwen.py, Qwen3NextModel and
_LinearAttentionVReorderBase; checked by tests/test_reference_qwen35.py on converted files):
- every `*norm.weight` is stored as 1 + w (Qwen3.5's RMSNorm is x * (1 + w)), except the gated
  ssm_norm (x * w), which is stored as is. So every norm here is a plain x * w.
- ssm_a = -exp(A_log) (already negative); ssm_dt.bias = dt_bias; ssm_conv1d.weight (C, K) with
  channels [q | k | v] = attn_qkv's output rows.
- value heads are in *tiled* order: value head j reads key head j % n_k_heads.
- keys: ssm.conv_kernel, ssm.state_size (head_k_dim), ssm.group_count (key heads),
  ssm.time_step_rank (value heads), ssm.inner_size (value heads * head_v_dim),
  attention.recurrent_layers (bool per block, else full_attention_interval n: layer il is
  recurrent iff (il + 1) % n != 0), rope.dimension_sections (M-RoPE sections; text positions
  are the same in every section, so they change nothing here).
- multi-token-prediction blocks: block_count counts them, `nextn_predict_layers` says how many
  of the last blocks they are; they are not part of the forward pass. A file converted with
  --mtp holds only that draft block (no blk.0.attn_norm.weight) and is refused.
"""

from __future__ import annotations

import array

from ...errors import ModelFileError, UnsupportedModelError
from ...modelfile.gguf_file import printable
from ..config import MAX_EXPERTS, MAX_HEADS, MAX_WIDTH, MetadataReader, ModelConfig, check_shapes, check_tensor_types
from ..qwen3.config import qwen3_config

DEFAULT_FULL_ATTENTION_INTERVAL = 4


def _per_layer_key(md: MetadataReader, key: str, n_layers: int, hi: int) -> tuple[int, ...]:
    """An integer key that llama.cpp also accepts as a per-block array."""
    value = md.gguf.arch_get(key)
    if isinstance(value, (list, array.array)):
        return md.ints(key, n_layers, hi=hi)
    return (md.int(key, required=True, hi=hi),) * n_layers


def recurrent_layers(md: MetadataReader, n_layers: int, n_blocks: int) -> tuple[bool, ...]:
    key = "attention.recurrent_layers"
    flags = md.gguf.arch_get(key)
    if flags is not None:
        if not isinstance(flags, (list, array.array)) or len(flags) != n_blocks:
            raise md.bad(key, f"one flag per block ({n_blocks})", flags)
        return tuple(bool(x) for x in md.ints(key, n_blocks, hi=1))[:n_layers]
    period = md.int("full_attention_interval", DEFAULT_FULL_ATTENTION_INTERVAL, lo=1, hi=MAX_WIDTH)
    return tuple((il + 1) % period != 0 for il in range(n_layers))


def _int_array(md: MetadataReader, key: str) -> tuple[int, ...]:
    value = md.gguf.arch_get(key)
    if value is None:
        return ()
    if not isinstance(value, (list, array.array)):
        raise md.bad(key, "an array of integers", value)
    return md.ints(key, len(value))


def config_from_gguf(gguf) -> ModelConfig:
    check_tensor_types(gguf)
    md = MetadataReader(gguf)
    moe = md.arch == "qwen35moe"
    n_blocks = md.layers()
    nextn = md.int("nextn_predict_layers", 0) or 0
    n_layers = n_blocks - nextn
    if n_layers <= 0 or "blk.0.attn_norm.weight" not in gguf.tensors:
        raise UnsupportedModelError(
            f"{printable(gguf.path, 1024)} holds only a multi-token-prediction draft block (converted with --mtp), "
            "not a model to run")
    n_k_heads = md.int("ssm.group_count", required=True, lo=1, hi=MAX_HEADS)
    n_v_heads = md.int("ssm.time_step_rank", required=True, lo=1, hi=MAX_HEADS)
    head_k_dim = md.int("ssm.state_size", required=True, lo=1, hi=MAX_WIDTH)
    inner = md.int("ssm.inner_size", required=True, lo=1, hi=MAX_WIDTH)
    if n_v_heads % n_k_heads or inner % n_v_heads:
        raise ModelFileError(
            f"GGUF ssm.* keys are inconsistent (group_count {n_k_heads}, time_step_rank {n_v_heads}, inner_size {inner}): "
            f"{printable(gguf.path, 1024)}")
    extra = {
        "n_blocks": n_blocks,
        "nextn_predict_layers": nextn,
        "recurrent_layers": recurrent_layers(md, n_layers, n_blocks),
        "conv_kernel": md.int("ssm.conv_kernel", required=True, lo=1, hi=MAX_WIDTH),
        "n_k_heads": n_k_heads,
        "n_v_heads": n_v_heads,
        "head_k_dim": head_k_dim,
        "head_v_dim": inner // n_v_heads,
        "rope_sections": _int_array(md, "rope.dimension_sections"),
    }
    if moe:
        n_expert = md.int("expert_count", required=True, lo=1, hi=MAX_EXPERTS)
        extra.update({
            "n_expert": n_expert,
            "n_expert_used": _per_layer_key(md, "expert_used_count", n_layers, MAX_EXPERTS),
            "n_ff_exp": _per_layer_key(md, "expert_feed_forward_length", n_layers, MAX_WIDTH),
            "n_ff_shexp": md.int("expert_shared_feed_forward_length", 0, hi=MAX_WIDTH) or 0,
        })
        if not all(0 < k <= n_expert for k in extra["n_expert_used"]):
            raise ModelFileError(f"GGUF expert_used_count must be in 1..{n_expert}: {printable(gguf.path, 1024)}")
        n_ff = md.int("feed_forward_length", extra["n_ff_exp"][0], hi=MAX_WIDTH)
    else:
        n_ff = md.int("feed_forward_length", required=True, lo=1, hi=MAX_WIDTH)
    config = qwen3_config(gguf, md, n_ff, extra, n_layers=n_layers, context_default=262144,
                          rope_theta_default=10_000_000.0, rope_dim_divisor=4)
    check_shapes_qwen35(gguf, config)
    return config


def expected_shapes(config: ModelConfig, il: int) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape in ggml order (shape[0] = row length) for layer il, as llama.cpp's
    loader wants them."""
    c, e, p = config, config.extra, f"blk.{il}."
    d = c.n_embd
    shapes = {p + "attn_norm.weight": (d,), p + "post_attention_norm.weight": (d,)}
    if e["recurrent_layers"][il]:
        key_dim, value_dim = e["n_k_heads"] * e["head_k_dim"], e["n_v_heads"] * e["head_v_dim"]
        shapes.update({
            p + "attn_qkv.weight": (d, 2 * key_dim + value_dim), p + "attn_gate.weight": (d, value_dim),
            p + "ssm_conv1d.weight": (e["conv_kernel"], 2 * key_dim + value_dim),
            p + "ssm_dt.bias": (e["n_v_heads"],), p + "ssm_a": (e["n_v_heads"],),
            p + "ssm_alpha.weight": (d, e["n_v_heads"]), p + "ssm_beta.weight": (d, e["n_v_heads"]),
            p + "ssm_norm.weight": (e["head_v_dim"],), p + "ssm_out.weight": (value_dim, d),
        })
    else:
        shapes.update({
            p + "attn_q.weight": (d, 2 * c.n_head * c.head_dim), p + "attn_k.weight": (d, c.n_head_kv * c.head_dim),
            p + "attn_v.weight": (d, c.n_head_kv * c.head_dim_v), p + "attn_output.weight": (c.n_head * c.head_dim_v, d),
            p + "attn_q_norm.weight": (c.head_dim,), p + "attn_k_norm.weight": (c.head_dim,),
        })
    if c.arch == "qwen35moe":
        f, n_exp = e["n_ff_exp"][il], e["n_expert"]
        shapes.update({p + "ffn_gate_inp.weight": (d, n_exp), p + "ffn_down_exps.weight": (f, d, n_exp),
                       p + "ffn_gate_exps.weight": (d, f, n_exp), p + "ffn_up_exps.weight": (d, f, n_exp)})
        if e["n_ff_shexp"]:
            fs = e["n_ff_shexp"]
            shapes.update({p + "ffn_gate_inp_shexp.weight": (d,), p + "ffn_gate_shexp.weight": (d, fs),
                           p + "ffn_up_shexp.weight": (d, fs), p + "ffn_down_shexp.weight": (fs, d)})
    else:
        shapes.update({p + "ffn_gate.weight": (d, c.n_ff), p + "ffn_up.weight": (d, c.n_ff),
                       p + "ffn_down.weight": (c.n_ff, d)})
    return shapes


def check_shapes_qwen35(gguf, config: ModelConfig) -> None:
    """Every tensor the forward reads exists with the shape the metadata implies (the converter
    writes ffn_gate_inp_shexp as (n_embd, 1): trailing 1s are ignored for it)."""
    want = {"token_embd.weight": (config.n_embd, config.vocab_size), "output_norm.weight": (config.n_embd,)}
    if not config.tied_embeddings:
        want["output.weight"] = (config.n_embd, config.vocab_size)
    for il in range(config.n_layers):
        shapes = expected_shapes(config, il)
        fused = f"blk.{il}.ffn_gate_up_exps.weight"
        if fused in gguf.tensors:  # --fuse-gate-up-exps: one (n_embd, 2 n_ff_exp, n_expert) tensor
            f, n_exp = config.extra["n_ff_exp"][il], config.extra["n_expert"]
            shapes.pop(f"blk.{il}.ffn_gate_exps.weight")
            shapes.pop(f"blk.{il}.ffn_up_exps.weight")
            shapes[fused] = (config.n_embd, 2 * f, n_exp)
        fused = f"blk.{il}.attn_qkv.weight"
        if not config.extra["recurrent_layers"][il] and fused in gguf.tensors:  # --fuse-qkv
            qkv = 2 * config.n_head * config.head_dim + config.n_head_kv * (config.head_dim + config.head_dim_v)
            for k in ("attn_q", "attn_k", "attn_v"):
                shapes.pop(f"blk.{il}.{k}.weight")
            shapes[fused] = (config.n_embd, qkv)
        want.update(shapes)
    check_shapes(gguf, want, config.arch, loose=frozenset(n for n in want if n.endswith("ffn_gate_inp_shexp.weight")))
