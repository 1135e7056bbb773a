"""The numpy blocks the families' reference forwards share: self-attention over the KV cache, the
gated FFN, softmax top-k routing and the routed-expert loop, and the LM head. Each takes the
ReferenceModel (its weights, config and cache) and one layer's input; families compose them in
their `layer()` the way the architecture's diagram reads."""

from __future__ import annotations

import numpy as np

from ..modelfile import tensor_names as T
from . import layers

_F32 = np.float32
# llama.cpp clamps the sum of the selected expert weights to the smallest normal f16 before dividing.
MIN_WEIGHT_SUM = _F32(6.103515625e-5)


def self_attention(model, il: int, h: np.ndarray, step, rope_theta: float, scale: float, window: int = 0,
                   query_scale: float | None = None, rope_pairs: bool = False, rope_freq_scale: float = 1.0,
                   rope_factors: np.ndarray | None = None) -> np.ndarray:
    """Wo attention(h): q/k/v projections, per-head RMSNorm of q and k (when the file has their
    weights), RoPE (NeoX halves, or adjacent pairs with rope_pairs; frequencies times
    rope_freq_scale and divided by rope_factors), q times query_scale (Gemma), GQA over cache +
    new tokens."""
    c, w, n = model.config, model.w.get, h.shape[0]
    q = layers.linear(h, w(T.blk(il, T.ATTN_Q))).reshape(n, c.n_head, c.head_dim)
    k = layers.linear(h, w(T.blk(il, T.ATTN_K))).reshape(n, c.n_head_kv, c.head_dim)
    v = layers.linear(h, w(T.blk(il, T.ATTN_V))).reshape(n, c.n_head_kv, c.head_dim_v)
    if T.blk(il, T.ATTN_Q_NORM) in model.w:
        q = layers.rmsnorm(q, w(T.blk(il, T.ATTN_Q_NORM)), c.rms_eps)
        k = layers.rmsnorm(k, w(T.blk(il, T.ATTN_K_NORM)), c.rms_eps)
    cos, sin = step.rope(c.rope_dim, rope_theta, rope_freq_scale, rope_factors)
    rotate = layers.rope_pairs if rope_pairs else layers.rope_neox
    q = rotate(q, cos, sin)
    if query_scale is not None:
        q = q * _F32(query_scale)
    k = rotate(k, cos, sin)
    a = model.attend(il, q, k, v, step, scale=scale, window=window)
    return layers.linear(a, w(T.blk(il, T.ATTN_OUT)))


def gated_ffn(model, il: int, h: np.ndarray, act=layers.silu, gate: str = T.FFN_GATE, up: str = T.FFN_UP,
              down: str = T.FFN_DOWN) -> np.ndarray:
    """down(act(gate h) * up h): SwiGLU with act=silu, GeGLU with act=gelu_tanh."""
    w = model.w.get
    f = act(layers.linear(h, w(T.blk(il, gate)))) * layers.linear(h, w(T.blk(il, up)))
    return layers.linear(f, w(T.blk(il, down)))


def softmax_topk(logits: np.ndarray, k: int, normalize: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Router logits (n, n_expert) -> (expert ids (n, k) int64, weights (n, k) float32).

    p = softmax(logits) in float32; the k largest p in decreasing order, equal p in increasing
    expert id (a stable sort: ties go to the lower id); with `normalize` the k weights are
    divided by their sum, clamped to >= 2^-14."""
    z = logits.astype(_F32, copy=False)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    p = (e / e.sum(axis=-1, keepdims=True)).astype(_F32, copy=False)
    ids = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    wts = np.take_along_axis(p, ids, axis=-1)
    if normalize:
        wts = normalize_weights(wts)
    return ids, wts.astype(_F32, copy=False)


def topk_margin(logits: np.ndarray, k: int) -> np.ndarray:
    """Per row (n,): softmax_topk's last chosen probability minus the best unchosen one, over the
    largest probability (inf when every expert is chosen): the rows whose expert choice any
    rounding of the router's input may flip (`reflex check` excuses them, see check.py)."""
    z = logits.astype(_F32, copy=False)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    p = (e / e.sum(axis=-1, keepdims=True)).astype(np.float64)
    if k >= p.shape[-1]:
        return np.full(p.shape[0], np.inf)
    ranked = -np.sort(-p, axis=-1)
    return (ranked[:, k - 1] - ranked[:, k]) / np.maximum(ranked[:, 0], 1e-30)


def normalize_weights(wts: np.ndarray) -> np.ndarray:
    return wts / np.maximum(wts.sum(axis=-1, keepdims=True), MIN_WEIGHT_SUM)


def routed_experts(h: np.ndarray, ids: np.ndarray, weights: np.ndarray, expert) -> np.ndarray:
    """sum over each token's chosen experts of weight * expert(h); expert(xid, rows_of_h) -> out.
    A token's expert outputs are added in increasing expert id."""
    out = np.zeros_like(h)
    for xid in np.unique(ids):
        rows, slot = np.nonzero(ids == xid)  # each token picks an expert at most once
        out[rows] += expert(int(xid), h[rows]) * weights[rows, slot][:, None]
    return out


def swiglu_expert(model, il: int, gate: str = T.FFN_GATE_EXPS, up: str = T.FFN_UP_EXPS,
                  down: str = T.FFN_DOWN_EXPS):
    """expert(xid, h) for stacked expert tensors: down_e(silu(gate_e h) * up_e h)."""
    def run(xid: int, hx: np.ndarray) -> np.ndarray:
        ex = model.w.expert
        f = layers.swiglu(layers.linear(hx, ex(T.blk(il, gate), xid)), layers.linear(hx, ex(T.blk(il, up), xid)))
        return layers.linear(f, ex(T.blk(il, down), xid))
    return run


def lm_head(model, x: np.ndarray, softcap: float | None = None) -> np.ndarray:
    """Logits: the final RMSNorm, then output.weight (or the tied token embedding), soft-capped
    when the model says so."""
    h = layers.rmsnorm(x, model.w.get(T.OUTPUT_NORM), model.config.rms_eps)
    name = T.OUTPUT if T.OUTPUT in model.w else T.TOKEN_EMBD
    logits = layers.linear(h, model.w.get(name))
    return layers.softcap(logits, softcap) if softcap else logits
