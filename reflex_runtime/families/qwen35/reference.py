"""Qwen3.5 hybrid (`qwen35`, `qwen35moe`) in numpy: Gated DeltaNet layers with recurrent state
and gated full-attention layers (the layer diagram and the converter's conventions are in
reflex_runtime/models/qwen35.py).

The cache holds, per full-attention layer, keys and values (as every family); per linear-attention
layer, the conv state (the last K-1 inputs of the conv) and the delta-rule state (H, dk, dv).
Recurrent state has no per-token history, so:
- a tree mask cannot be applied (`supports_tree_mask = False`: the CPU runner scores system1
  candidates from copies of the state after the prompt); only the causal mask is accepted;
- `truncate(n)` works for n == length (nothing to do) and n == 0 (empty state), and otherwise
  raises RequestError: keep a `copy()` of the cache at the point to return to instead.
A forward call commits the new recurrent state only when it completes.
"""

from __future__ import annotations

import numpy as np

from ...modelfile import tensor_names as T
from ...errors import RequestError
from ...reference import blocks, layers
from ...reference.base import KVCache, ReferenceModel
from . import delta_net

_F32 = np.float32


def sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return _F32(1.0) / (_F32(1.0) + np.exp(-x))


def softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(_F32(0.0), x).astype(_F32, copy=False)


class HybridCache(KVCache):
    """KVCache for the attention layers plus conv and delta-rule states for the recurrent ones."""

    def __init__(self, config, max_tokens: int):
        c, e = config, config.extra
        rec = e["recurrent_layers"]
        shapes = [(0, 0, 0) if r else (c.n_head_kv, c.head_dim, c.head_dim_v) for r in rec]
        super().__init__(shapes, max_tokens)
        channels = 2 * e["n_k_heads"] * e["head_k_dim"] + e["n_v_heads"] * e["head_v_dim"]
        self._state_shapes = ((e["conv_kernel"] - 1, channels), (e["n_v_heads"], e["head_k_dim"], e["head_v_dim"]))
        self.conv = [np.zeros(self._state_shapes[0], dtype=_F32) if r else None for r in rec]
        self.ssm = [np.zeros(self._state_shapes[1], dtype=_F32) if r else None for r in rec]
        self.pending: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def copy(self) -> "HybridCache":
        new = super().copy()  # the full-attention layers' K/V
        new._state_shapes = self._state_shapes
        new.conv = [None if a is None else a.copy() for a in self.conv]
        new.ssm = [None if a is None else a.copy() for a in self.ssm]
        new.pending = {}
        return new

    def truncate(self, n: int) -> None:
        if not 0 <= n <= self.length:
            raise RequestError(f"cannot truncate a cache of {self.length} tokens to {n}")
        if n == self.length:
            return
        if n != 0:
            raise RequestError(
                f"cannot truncate a recurrent (linear-attention) state from {self.length} to {n} tokens; copy() the cache at {n} instead")
        self.length = 0
        self.conv = [None if a is None else np.zeros_like(a) for a in self.conv]
        self.ssm = [None if a is None else np.zeros_like(a) for a in self.ssm]


class Qwen35(ReferenceModel):
    supports_tree_mask = False
    chunk = delta_net.CHUNK  # tokens per chunk of the delta rule in calls of more than one token

    def new_cache(self, max_tokens: int) -> HybridCache:
        return HybridCache(self.config, max_tokens)

    def forward(self, token_ids, cache: HybridCache, positions=None, mask=None) -> np.ndarray:
        if mask is not None:
            mask = np.asarray(mask, dtype=bool)
            n = mask.shape[0] if mask.ndim == 2 else -1
            if mask.shape == (n, n) and not np.array_equal(mask, np.tril(np.ones((n, n), dtype=bool))):
                raise RequestError(f"{self.config.arch} has recurrent layers: only the causal mask is supported")
        cache.pending = {}
        try:
            logits = super().forward(token_ids, cache, positions=positions, mask=mask)
        finally:
            pending, cache.pending = cache.pending, {}
        for il, (conv, ssm) in pending.items():
            cache.conv[il], cache.ssm[il] = conv, ssm
        return logits

    # -- layers ---------------------------------------------------------------------------------

    def layer(self, il: int, x: np.ndarray, step) -> np.ndarray:
        c, w = self.config, self.w.get
        h = layers.rmsnorm(x, w(T.blk(il, T.ATTN_NORM)), c.rms_eps)
        if c.extra["recurrent_layers"][il]:
            x = x + self.linear_attention(il, h, step)
        else:
            x = x + self.full_attention(il, h, step)
        h = layers.rmsnorm(x, w(T.blk(il, T.POST_ATTN_NORM)), c.rms_eps)
        return x + (self.moe(il, h) if c.arch == "qwen35moe" else blocks.gated_ffn(self, il, h))

    def linear_attention(self, il: int, h: np.ndarray, step) -> np.ndarray:
        c, e, n = self.config, self.config.extra, h.shape[0]

        def w(name):
            return self.w.get(T.blk(il, name))

        nk, nv, dk, dv = e["n_k_heads"], e["n_v_heads"], e["head_k_dim"], e["head_v_dim"]
        cache = step.cache
        mixed, conv_state = delta_net.causal_conv1d(layers.linear(h, w(T.ATTN_QKV)), cache.conv[il], w(T.SSM_CONV1D))
        mixed = layers.silu(mixed)
        q = mixed[:, :nk * dk].reshape(n, nk, dk)
        k = mixed[:, nk * dk:2 * nk * dk].reshape(n, nk, dk)
        v = mixed[:, 2 * nk * dk:].reshape(n, nv, dv)
        q = delta_net.l2norm(q, c.rms_eps) * _F32(1.0 / np.sqrt(dk))
        k = delta_net.l2norm(k, c.rms_eps)
        if nv != nk:  # value head j reads key head j % nk (the converter's tiled order)
            q = np.tile(q, (1, nv // nk, 1))
            k = np.tile(k, (1, nv // nk, 1))
        beta = sigmoid(layers.linear(h, w(T.SSM_BETA)))
        g = w(T.SSM_A) * softplus(layers.linear(h, w(T.SSM_ALPHA)) + w(T.SSM_DT_BIAS))
        if n == 1:
            o, state = delta_net.delta_rule_recurrent(q, k, v, g, beta, cache.ssm[il])
        else:
            o, state = delta_net.delta_rule_chunked(q, k, v, g, beta, cache.ssm[il], self.chunk)
        cache.pending[il] = (conv_state, state)
        z = layers.linear(h, w(T.ATTN_GATE)).reshape(n, nv, dv)
        o = layers.rmsnorm(o, w(T.SSM_NORM), c.rms_eps) * layers.silu(z)
        return layers.linear(o.reshape(n, nv * dv), w(T.SSM_OUT))

    def full_attention(self, il: int, h: np.ndarray, step) -> np.ndarray:
        c, n = self.config, h.shape[0]

        def w(name):
            return self.w.get(T.blk(il, name))

        hd = c.head_dim
        if T.blk(il, T.ATTN_Q) in self.w:
            qg = layers.linear(h, w(T.ATTN_Q))
            k = layers.linear(h, w(T.ATTN_K))
            v = layers.linear(h, w(T.ATTN_V))
        else:  # converted with --fuse-qkv: rows [query+gate | k | v]
            qkv = layers.linear(h, w(T.ATTN_QKV))
            nq, nkv = 2 * c.n_head * hd, c.n_head_kv * hd
            qg, k, v = qkv[:, :nq], qkv[:, nq:nq + nkv], qkv[:, nq + nkv:]
        qg = qg.reshape(n, c.n_head, 2 * hd)  # per head: [query | gate]
        gate = qg[:, :, hd:].reshape(n, c.n_head * hd)
        q = layers.rmsnorm(qg[:, :, :hd], w(T.ATTN_Q_NORM), c.rms_eps)
        k = layers.rmsnorm(k.reshape(n, c.n_head_kv, hd), w(T.ATTN_K_NORM), c.rms_eps)
        v = v.reshape(n, c.n_head_kv, c.head_dim_v)
        cos, sin = step.rope(c.rope_dim, c.rope_theta)
        q = layers.rope_neox(q, cos, sin)
        k = layers.rope_neox(k, cos, sin)
        a = self.attend(il, q, k, v, step, scale=1.0 / np.sqrt(hd)) * sigmoid(gate)
        return layers.linear(a, w(T.ATTN_OUT))

    def moe(self, il: int, h: np.ndarray) -> np.ndarray:
        """Softmax over all experts, the top k (ties to the lower id), weights renormalized over
        those k; plus the shared expert times sigmoid(h . ffn_gate_inp_shexp)."""
        e = self.config.extra

        def w(name):
            return self.w.get(T.blk(il, name))

        logits = layers.linear(h, w(T.FFN_ROUTER))
        ids, weights = blocks.softmax_topk(logits, e["n_expert_used"][il])
        self.note_route_margin(blocks.topk_margin(logits, e["n_expert_used"][il]))
        if T.blk(il, T.FFN_GATE_UP_EXPS) in self.w:  # converted with --fuse-gate-up-exps: [gate | up] rows
            gate_up = w(T.FFN_GATE_UP_EXPS)  # (E, 2F, D)
            f = gate_up.shape[1] // 2
            down = w(T.FFN_DOWN_EXPS)

            def expert(xid: int, hx: np.ndarray) -> np.ndarray:
                a = layers.swiglu(layers.linear(hx, gate_up[xid, :f]), layers.linear(hx, gate_up[xid, f:]))
                return layers.linear(a, down[xid])
        else:
            expert = blocks.swiglu_expert(self, il)
        out = blocks.routed_experts(h, ids, weights, expert)
        if T.blk(il, T.FFN_UP_SHEXP) in self.w:
            s = blocks.gated_ffn(self, il, h, gate=T.FFN_GATE_SHEXP, up=T.FFN_UP_SHEXP, down=T.FFN_DOWN_SHEXP)
            out += s * sigmoid(layers.linear(h, w(T.FFN_ROUTER_SHEXP).reshape(1, -1)))
        return out
