"""Qwen3 dense: configuration from GGUF.

Per layer: RMSNorm -> attention (q/k/v projections, per-head RMSNorm on q and k, NeoX RoPE,
causal GQA) -> residual; RMSNorm -> SwiGLU FFN -> residual. LM head is `output.weight`, or
`token_embd.weight` when the file has no output tensor (tied embeddings, e.g. Qwen3-0.6B).
"""

from __future__ import annotations

from ..config import (MAX_HEADS, MAX_WIDTH, MetadataReader, ModelConfig, attention_shapes, check_shapes,
                      check_tensor_types, embedding_shape, file_type_name, gated_ffn_shapes, head_shapes)


def config_from_gguf(gguf) -> ModelConfig:
    check_tensor_types(gguf)
    md = MetadataReader(gguf)
    config = qwen3_config(gguf, md, n_ff=md.int("feed_forward_length", required=True, lo=1, hi=MAX_WIDTH))
    check_dense_shapes(gguf, config)
    return config


def check_dense_shapes(gguf, config: ModelConfig) -> None:
    """Embedding, head and every layer's attention and SwiGLU tensors have the configured shapes."""
    want = head_shapes(config)
    for il in range(config.n_layers):
        want.update(attention_shapes(config, il, gguf))
        want.update(gated_ffn_shapes(config.n_embd, config.n_ff, il))
    check_shapes(gguf, want, config.arch)


def qwen3_config(gguf, md: MetadataReader, n_ff: int, extra: dict | None = None, *, n_layers: int | None = None,
                 context_default: int = 40960, rope_theta_default: float = 1_000_000.0,
                 rope_dim_divisor: int = 1) -> ModelConfig:
    """The fields the Qwen3 family (dense, MoE, Qwen3.5) writes the same way; `extra` holds family
    specifics. Qwen3.5 passes its own layer count (MTP blocks excluded) and defaults."""
    n_embd = md.int("embedding_length", required=True, lo=1, hi=MAX_WIDTH)
    n_head = md.int("attention.head_count", required=True, lo=1, hi=MAX_HEADS)
    head_dim = md.int("attention.key_length", max(n_embd // n_head, 1), lo=1, hi=MAX_WIDTH)
    _, vocab = embedding_shape(gguf)
    return ModelConfig(
        arch=md.arch,
        n_layers=md.layers() if n_layers is None else n_layers,
        n_embd=n_embd,
        n_ff=n_ff,
        n_head=n_head,
        n_head_kv=md.int("attention.head_count_kv", n_head, lo=1, hi=MAX_HEADS),
        head_dim=head_dim,
        head_dim_v=md.int("attention.value_length", head_dim, lo=1, hi=MAX_WIDTH),
        vocab_size=vocab,
        context_length=md.int("context_length", context_default, lo=1),
        rms_eps=md.float("attention.layer_norm_rms_epsilon", 1e-6, lo=0.0, hi=1.0, lo_open=True),
        rope_theta=md.float("rope.freq_base", rope_theta_default, lo=1.0, lo_open=True),
        rope_dim=md.int("rope.dimension_count", head_dim // rope_dim_divisor, hi=MAX_WIDTH),
        tied_embeddings="output.weight" not in gguf.tensors,
        extra=dict(extra or {}),
        name=md.str("general.name", "") or "",
        file_type=file_type_name(gguf),
    )
