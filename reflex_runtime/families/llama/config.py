"""Llama: configuration from GGUF.

Per layer: RMSNorm -> attention (q/k/v projections, rotary embedding, causal GQA, scale
1/sqrt(head_dim)) -> residual; RMSNorm -> SwiGLU FFN -> residual. The LM head is output.weight,
or token_embd.weight when the file has none (tied: Llama 3.2 1B/3B, SmolLM2).

What llama.cpp takes from the file for `llama`, and what we follow:
- rotary: llama.cpp's "normal" rope, rotating adjacent pairs (x[2i], x[2i+1]): the converter
  permutes the q/k rows so HF's rotate-half pairs land next to each other. Pair i < rope_dim/2
  turns by pos * freq_scale * freq_base^(-2i/rope_dim) / factor_i, with
  `rope.dimension_count` (default head_dim) and `rope.freq_base` (default 10000);
- Llama 3.1+ rope scaling: the tensor `rope_freqs.weight` (rope_dim/2 F32 factors, the same for
  every layer), written by the converter instead of keys;
- linear scaling: freq_scale = 1 / `rope.scaling.factor` (or the older `rope.scale_linear`), as
  llama.cpp applies it for scaling types none and linear. YaRN and LongRoPE are refused;
- no biases and no routed experts (Mixtral-style files): refused with the tensor or key named.
"""

from __future__ import annotations

from ...modelfile import tensor_names as T
from ...errors import ModelFileError, UnsupportedModelError
from ...modelfile.gguf_file import printable
from ..config import (MAX_HEADS, MAX_WIDTH, MetadataReader, ModelConfig, check_tensor_types, embedding_shape,
                      file_type_name)

_BIASES = ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias", "ffn_gate.bias", "ffn_up.bias",
           "ffn_down.bias")


def _rope_freq_scale(gguf, md: MetadataReader) -> float:
    kind = md.str("rope.scaling.type", "none") or "none"
    if kind not in ("none", "linear"):
        raise UnsupportedModelError(f"unsupported rope scaling '{printable(kind)}' for llama in {printable(gguf.path, 1024)}; "
                                    "supported: none, linear, and Llama 3's rope_freqs")
    factor = md.float("rope.scale_linear", 0.0) or md.float("rope.scaling.factor", 0.0) or 0.0
    if factor < 0:
        raise ModelFileError(f"GGUF rope scaling factor {factor} is negative: {gguf.path}")
    return 1.0 / factor if factor > 0 else 1.0


def _check_shape(gguf, name: str, shape: tuple[int, ...]) -> None:
    ti = gguf.tensor(name)  # ModelFileError naming it when absent
    if tuple(ti.shape) != shape:
        raise ModelFileError(f"GGUF tensor '{name}' has shape {tuple(ti.shape)}, expected {shape}: {printable(gguf.path, 1024)}")


def _check_tensors(gguf, c: ModelConfig) -> None:
    for il in range(c.n_layers):
        for name, shape in ((T.ATTN_Q, (c.n_embd, c.n_head * c.head_dim)), (T.ATTN_K, (c.n_embd, c.n_head_kv * c.head_dim)),
                            (T.ATTN_V, (c.n_embd, c.n_head_kv * c.head_dim_v)), (T.ATTN_OUT, (c.n_head * c.head_dim_v, c.n_embd)),
                            (T.FFN_GATE, (c.n_embd, c.n_ff)), (T.FFN_UP, (c.n_embd, c.n_ff)), (T.FFN_DOWN, (c.n_ff, c.n_embd)),
                            (T.ATTN_NORM, (c.n_embd,)), (T.FFN_NORM, (c.n_embd,))):
            _check_shape(gguf, T.blk(il, name), shape)
        for bias in _BIASES:
            if T.blk(il, bias) in gguf.tensors:
                raise UnsupportedModelError(f"llama files with biases are not supported (tensor '{T.blk(il, bias)}')")
    _check_shape(gguf, T.OUTPUT_NORM, (c.n_embd,))
    if not c.tied_embeddings:
        _check_shape(gguf, T.OUTPUT, (c.n_embd, c.vocab_size))
    if T.ROPE_FREQS in gguf.tensors:
        _check_shape(gguf, T.ROPE_FREQS, (c.rope_dim // 2,))
        if gguf.tensor(T.ROPE_FREQS).type_name != "F32":
            raise ModelFileError(f"GGUF tensor '{T.ROPE_FREQS}' should be F32: {printable(gguf.path, 1024)}")


def config_from_gguf(gguf) -> ModelConfig:
    check_tensor_types(gguf)
    md = MetadataReader(gguf)
    where = printable(gguf.path, 1024)
    if (md.int("expert_count", 0) or 0) > 0:
        raise UnsupportedModelError(f"llama files with routed experts (Mixtral-style) are not supported: {where}")
    n_embd = md.int("embedding_length", required=True, lo=1, hi=MAX_WIDTH)
    n_head = md.int("attention.head_count", required=True, lo=1, hi=MAX_HEADS)
    n_head_kv = md.int("attention.head_count_kv", n_head, lo=1, hi=MAX_HEADS)
    if n_head % n_head_kv or n_embd % n_head:
        raise ModelFileError(f"GGUF has {n_head} heads over {n_head_kv} KV heads for {n_embd} dims: {where}")
    head_dim = md.int("attention.key_length", n_embd // n_head, lo=1, hi=MAX_WIDTH)
    rope_dim = md.int("rope.dimension_count", head_dim, hi=MAX_WIDTH)
    if rope_dim <= 0 or rope_dim % 2 or rope_dim > head_dim:
        raise ModelFileError(f"GGUF rope.dimension_count {rope_dim} does not fit heads of {head_dim}: {where}")
    emb_rows, vocab = embedding_shape(gguf)
    if emb_rows != n_embd:
        raise ModelFileError(f"GGUF token_embd rows of {emb_rows} do not match embedding_length {n_embd}: {where}")
    c = ModelConfig(
        arch=md.arch,
        n_layers=md.layers(),
        n_embd=n_embd,
        n_ff=md.int("feed_forward_length", required=True, lo=1, hi=MAX_WIDTH),
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        head_dim_v=md.int("attention.value_length", head_dim, lo=1, hi=MAX_WIDTH),
        vocab_size=vocab,
        context_length=md.int("context_length", 4096, lo=1),
        rms_eps=md.float("attention.layer_norm_rms_epsilon", 1e-5, lo=0.0, hi=1.0, lo_open=True),
        rope_theta=md.float("rope.freq_base", 10_000.0, lo=1.0, lo_open=True),
        rope_dim=rope_dim,
        tied_embeddings=T.OUTPUT not in gguf.tensors,
        extra={
            "rope_pairs": True,  # llama.cpp's normal rope (see above)
            "rope_freq_scale": _rope_freq_scale(gguf, md),
            "rope_factors": T.ROPE_FREQS in gguf.tensors,
        },
        name=md.str("general.name", "") or "",
        file_type=file_type_name(gguf),
    )
    _check_tensors(gguf, c)
    return c
