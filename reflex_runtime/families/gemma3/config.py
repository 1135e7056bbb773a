"""Gemma 3 (text): configuration from GGUF.

Per layer: RMSNorm -> attention (q/k/v, per-head RMSNorm on q and k, NeoX RoPE, q scaled by
`query_scale`, GQA; local layers see only the last `sliding_window` positions and use the local
RoPE base) -> RMSNorm (post-attention) -> residual; RMSNorm -> GELU(tanh) gated FFN -> RMSNorm
(post-FFN) -> residual. The input embedding is multiplied by sqrt(n_embd); the LM head is the
token embedding (tied) unless the file has output.weight; logits are soft-capped when the file
says so. Norm weights in GGUF already include Gemma's +1 (the converter adds it).

What llama.cpp takes from the file and what it hard-codes (we follow it, so files mean the same):
- local layers: `attention.sliding_window_pattern` if present (bool array, or a period n with
  layer il local iff il % n < n - 1), else the period 6 (5 local : 1 global); no
  `attention.sliding_window` (or 0) means every layer is global;
- local RoPE base: `rope.freq_base_swa`, default 10000 (older converters do not write it);
- query scale: 1/sqrt(head_dim), except the 62-layer 27B model: 1/sqrt(n_embd / n_head);
  the HF field query_pre_attn_scalar is not in the file;
- a key at position p0 is outside a query p1's window when p1 - p0 >= sliding_window.
"""

from __future__ import annotations

import array
import math

from ...modelfile import tensor_names as T
from ..config import (MAX_HEADS, MAX_WIDTH, MetadataReader, ModelConfig, attention_shapes, check_shapes,
                      check_tensor_types, embedding_shape, file_type_name, gated_ffn_shapes, head_shapes)

DEFAULT_SWA_PERIOD = 6
DEFAULT_LOCAL_ROPE_BASE = 10_000.0


def local_layers(md: MetadataReader, n_layers: int, window: int) -> tuple[bool, ...]:
    if window <= 0:
        return (False,) * n_layers
    key = "attention.sliding_window_pattern"
    pattern = md.gguf.arch_get(key)
    if pattern is None:
        period = DEFAULT_SWA_PERIOD
    elif isinstance(pattern, (list, array.array)):
        flags = md.ints(key, n_layers, hi=1)  # a bool (or 0/1) per layer
        if flags is None or len(pattern) != n_layers:
            raise md.bad(key, f"one flag per layer ({n_layers})", pattern)
        return tuple(bool(x) for x in flags)
    else:
        period = md.int(key, hi=MAX_WIDTH)
    if period == 0:
        return (True,) * n_layers
    return tuple(il % period < period - 1 for il in range(n_layers))


def config_from_gguf(gguf) -> ModelConfig:
    check_tensor_types(gguf)
    md = MetadataReader(gguf)
    n_embd = md.int("embedding_length", required=True, lo=1, hi=MAX_WIDTH)
    n_layers = md.layers()
    n_head = md.int("attention.head_count", required=True, lo=1, hi=MAX_HEADS)
    head_dim = md.int("attention.key_length", max(n_embd // n_head, 1), lo=1, hi=MAX_WIDTH)
    window = md.int("attention.sliding_window", 0) or 0
    if n_layers == 62:  # Gemma 3 27B (llama.cpp, after gemma_pytorch's config)
        query_scale = 1.0 / math.sqrt(n_embd / n_head)
    else:
        query_scale = 1.0 / math.sqrt(head_dim)
    softcap = md.float("final_logit_softcapping", 0.0, lo=0.0) or 0.0
    _, vocab = embedding_shape(gguf)
    config = ModelConfig(
        arch=md.arch,
        n_layers=n_layers,
        n_embd=n_embd,
        n_ff=md.int("feed_forward_length", required=True, lo=1, hi=MAX_WIDTH),
        n_head=n_head,
        n_head_kv=md.int("attention.head_count_kv", n_head, lo=1, hi=MAX_HEADS),
        head_dim=head_dim,
        head_dim_v=md.int("attention.value_length", head_dim, lo=1, hi=MAX_WIDTH),
        vocab_size=vocab,
        context_length=md.int("context_length", 131072, lo=1),
        rms_eps=md.float("attention.layer_norm_rms_epsilon", 1e-6, lo=0.0, hi=1.0, lo_open=True),
        rope_theta=md.float("rope.freq_base", 1_000_000.0, lo=1.0, lo_open=True),
        rope_dim=md.int("rope.dimension_count", head_dim, hi=MAX_WIDTH),
        tied_embeddings="output.weight" not in gguf.tensors,
        extra={
            "sliding_window": window,
            "local_layers": local_layers(md, n_layers, window),
            "rope_theta_local": md.float("rope.freq_base_swa", DEFAULT_LOCAL_ROPE_BASE, lo=1.0, lo_open=True),
            "query_scale": query_scale,
            "embed_scale": math.sqrt(n_embd),
            "final_logit_softcap": softcap if softcap > 0 else None,
        },
        name=md.str("general.name", "") or "",
        file_type=file_type_name(gguf),
    )
    want = head_shapes(config)
    for il in range(n_layers):
        want.update(attention_shapes(config, il, gguf))
        want.update(gated_ffn_shapes(n_embd, config.n_ff, il))
        want[T.blk(il, T.POST_ATTN_NORM)] = (n_embd,)
        want[T.blk(il, T.POST_FFN_NORM)] = (n_embd,)
    check_shapes(gguf, want, config.arch)
    return config
