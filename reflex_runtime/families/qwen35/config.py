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

from ...errors import ModelFileError, UnsupportedModelError
from ..config import MetadataReader, ModelConfig, check_tensor_types
from ..qwen3.config import qwen3_config

DEFAULT_FULL_ATTENTION_INTERVAL = 4


def _per_layer_key(gguf, key: str, n_layers: int) -> tuple[int, ...]:
    """An integer key that llama.cpp also accepts as a per-block array."""
    value = gguf.arch_get(key)
    if value is None:
        raise ModelFileError(f"GGUF is missing required key '{gguf.architecture}.{key}': {gguf.path}")
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,) * n_layers
    if isinstance(value, (str, float, bool)) or len(value) < n_layers:
        raise ModelFileError(f"GGUF key '{gguf.architecture}.{key}' should be an integer or one per block: {gguf.path}")
    return tuple(int(v) for v in value)[:n_layers]


def recurrent_layers(gguf, n_layers: int, n_blocks: int) -> tuple[bool, ...]:
    flags = gguf.arch_get("attention.recurrent_layers")
    if flags is not None:
        if isinstance(flags, (int, float, str)) or len(flags) != n_blocks:
            raise ModelFileError(f"GGUF attention.recurrent_layers should have {n_blocks} entries: {gguf.path}")
        return tuple(bool(x) for x in flags)[:n_layers]
    period = gguf.arch_get("full_attention_interval")
    period = DEFAULT_FULL_ATTENTION_INTERVAL if period is None else int(period)
    if period <= 0:
        raise ModelFileError(f"GGUF full_attention_interval must be positive, got {period}: {gguf.path}")
    return tuple((il + 1) % period != 0 for il in range(n_layers))


def config_from_gguf(gguf) -> ModelConfig:
    check_tensor_types(gguf)
    md = MetadataReader(gguf)
    moe = md.arch == "qwen35moe"
    n_blocks = md.int("block_count", required=True)
    nextn = md.int("nextn_predict_layers", 0) or 0
    n_layers = n_blocks - nextn
    if nextn < 0 or n_layers <= 0 or "blk.0.attn_norm.weight" not in gguf.tensors:
        raise UnsupportedModelError(
            f"{gguf.path} holds only a multi-token-prediction draft block (converted with --mtp), not a model to run")
    n_k_heads = md.int("ssm.group_count", required=True)
    n_v_heads = md.int("ssm.time_step_rank", required=True)
    head_k_dim = md.int("ssm.state_size", required=True)
    inner = md.int("ssm.inner_size", required=True)
    if min(n_k_heads, n_v_heads, head_k_dim, inner) <= 0 or n_v_heads % n_k_heads or inner % n_v_heads:
        raise ModelFileError(
            f"GGUF ssm.* keys are inconsistent (group_count {n_k_heads}, time_step_rank {n_v_heads}, inner_size {inner}): {gguf.path}")
    extra = {
        "n_blocks": n_blocks,
        "nextn_predict_layers": nextn,
        "recurrent_layers": recurrent_layers(gguf, n_layers, n_blocks),
        "conv_kernel": md.int("ssm.conv_kernel", required=True),
        "n_k_heads": n_k_heads,
        "n_v_heads": n_v_heads,
        "head_k_dim": head_k_dim,
        "head_v_dim": inner // n_v_heads,
        "rope_sections": tuple(gguf.arch_get("rope.dimension_sections") or ()),
    }
    if moe:
        n_expert = md.int("expert_count", required=True)
        extra.update({
            "n_expert": n_expert,
            "n_expert_used": _per_layer_key(gguf, "expert_used_count", n_layers),
            "n_ff_exp": _per_layer_key(gguf, "expert_feed_forward_length", n_layers),
            "n_ff_shexp": md.int("expert_shared_feed_forward_length", 0) or 0,
        })
        if not all(0 < k <= n_expert for k in extra["n_expert_used"]):
            raise ModelFileError(f"GGUF expert_used_count must be in 1..{n_expert}: {gguf.path}")
        n_ff = md.int("feed_forward_length", extra["n_ff_exp"][0])
    else:
        n_ff = md.int("feed_forward_length", required=True)
    config = qwen3_config(gguf, md, n_ff, extra, n_layers=n_layers, context_default=262144,
                          rope_theta_default=10_000_000.0, rope_dim_divisor=4)
    check_shapes(gguf, config)
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


def check_shapes(gguf, config: ModelConfig) -> None:
    """Every tensor the forward reads exists with the shape the metadata implies (trailing 1s
    ignored: the converter writes ffn_gate_inp_shexp as (n_embd, 1))."""
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
    for name, shape in want.items():
        ti = gguf.tensors.get(name)
        if ti is None:
            raise ModelFileError(f"GGUF is missing tensor '{name}' ({config.arch}): {gguf.path}")
        got = tuple(ti.shape)
        while len(got) > len(shape) and got[-1] == 1:
            got = got[:-1]
        if got != shape:
            raise ModelFileError(f"GGUF tensor '{name}' has shape {tuple(ti.shape)}, expected {shape}: {gguf.path}")
