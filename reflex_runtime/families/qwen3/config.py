"""Qwen3 dense: configuration from GGUF.

Per layer: RMSNorm -> attention (q/k/v projections, per-head RMSNorm on q and k, NeoX RoPE,
causal GQA) -> residual; RMSNorm -> SwiGLU FFN -> residual. LM head is `output.weight`, or
`token_embd.weight` when the file has no output tensor (tied embeddings, e.g. Qwen3-0.6B).
"""

from __future__ import annotations

from ..config import MetadataReader, ModelConfig, check_tensor_types, file_type_name


def config_from_gguf(gguf) -> ModelConfig:
    check_tensor_types(gguf)
    md = MetadataReader(gguf)
    return qwen3_config(gguf, md, n_ff=md.int("feed_forward_length", required=True))


def qwen3_config(gguf, md: MetadataReader, n_ff: int, extra: dict | None = None, *, n_layers: int | None = None,
                 context_default: int = 40960, rope_theta_default: float = 1_000_000.0,
                 rope_dim_divisor: int = 1) -> ModelConfig:
    """The fields the Qwen3 family (dense, MoE, Qwen3.5) writes the same way; `extra` holds family
    specifics. Qwen3.5 passes its own layer count (MTP blocks excluded) and defaults."""
    n_embd = md.int("embedding_length", required=True)
    n_head = md.int("attention.head_count", required=True)
    head_dim = md.int("attention.key_length", n_embd // n_head)
    emb = gguf.tensor("token_embd.weight")
    return ModelConfig(
        arch=md.arch,
        n_layers=md.int("block_count", required=True) if n_layers is None else n_layers,
        n_embd=n_embd,
        n_ff=n_ff,
        n_head=n_head,
        n_head_kv=md.int("attention.head_count_kv", n_head),
        head_dim=head_dim,
        head_dim_v=md.int("attention.value_length", head_dim),
        vocab_size=emb.shape[1],
        context_length=md.int("context_length", context_default),
        rms_eps=md.float("attention.layer_norm_rms_epsilon", 1e-6),
        rope_theta=md.float("rope.freq_base", rope_theta_default),
        rope_dim=md.int("rope.dimension_count", head_dim // rope_dim_divisor),
        tied_embeddings="output.weight" not in gguf.tensors,
        extra=dict(extra or {}),
        name=md.str("general.name", "") or "",
        file_type=file_type_name(gguf),
    )
