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

from ..errors import RequestError
from . import delta_net, ops
from .base import KVCache, ReferenceModel

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
        p = f"blk.{il}."
        h = ops.rmsnorm(x, w(p + "attn_norm.weight"), c.rms_eps)
        if c.extra["recurrent_layers"][il]:
            x = x + self.linear_attention(il, h, step)
        else:
            x = x + self.full_attention(il, h, step)
        h = ops.rmsnorm(x, w(p + "post_attention_norm.weight"), c.rms_eps)
        return x + (self.moe(il, h) if c.arch == "qwen35moe" else self.ffn(il, h))

    def linear_attention(self, il: int, h: np.ndarray, step) -> np.ndarray:
        c, e, w, n = self.config, self.config.extra, self.w.get, h.shape[0]
        p = f"blk.{il}."
        nk, nv, dk, dv = e["n_k_heads"], e["n_v_heads"], e["head_k_dim"], e["head_v_dim"]
        cache = step.cache
        mixed, conv_state = delta_net.causal_conv1d(ops.linear(h, w(p + "attn_qkv.weight")), cache.conv[il],
                                                    w(p + "ssm_conv1d.weight"))
        mixed = ops.silu(mixed)
        q = mixed[:, :nk * dk].reshape(n, nk, dk)
        k = mixed[:, nk * dk:2 * nk * dk].reshape(n, nk, dk)
        v = mixed[:, 2 * nk * dk:].reshape(n, nv, dv)
        q = delta_net.l2norm(q, c.rms_eps) * _F32(1.0 / np.sqrt(dk))
        k = delta_net.l2norm(k, c.rms_eps)
        if nv != nk:  # value head j reads key head j % nk (the converter's tiled order)
            q = np.tile(q, (1, nv // nk, 1))
            k = np.tile(k, (1, nv // nk, 1))
        beta = sigmoid(ops.linear(h, w(p + "ssm_beta.weight")))
        g = w(p + "ssm_a") * softplus(ops.linear(h, w(p + "ssm_alpha.weight")) + w(p + "ssm_dt.bias"))
        if n == 1:
            o, state = delta_net.delta_rule_recurrent(q, k, v, g, beta, cache.ssm[il])
        else:
            o, state = delta_net.delta_rule_chunked(q, k, v, g, beta, cache.ssm[il], self.chunk)
        cache.pending[il] = (conv_state, state)
        z = ops.linear(h, w(p + "attn_gate.weight")).reshape(n, nv, dv)
        o = ops.rmsnorm(o, w(p + "ssm_norm.weight"), c.rms_eps) * ops.silu(z)
        return ops.linear(o.reshape(n, nv * dv), w(p + "ssm_out.weight"))

    def full_attention(self, il: int, h: np.ndarray, step) -> np.ndarray:
        c, w, n = self.config, self.w.get, h.shape[0]
        p = f"blk.{il}."
        hd = c.head_dim
        if p + "attn_q.weight" in self.w:
            qg = ops.linear(h, w(p + "attn_q.weight"))
            k = ops.linear(h, w(p + "attn_k.weight"))
            v = ops.linear(h, w(p + "attn_v.weight"))
        else:  # converted with --fuse-qkv: rows [query+gate | k | v]
            qkv = ops.linear(h, w(p + "attn_qkv.weight"))
            nq, nkv = 2 * c.n_head * hd, c.n_head_kv * hd
            qg, k, v = qkv[:, :nq], qkv[:, nq:nq + nkv], qkv[:, nq + nkv:]
        qg = qg.reshape(n, c.n_head, 2 * hd)  # per head: [query | gate]
        gate = qg[:, :, hd:].reshape(n, c.n_head * hd)
        q = ops.rmsnorm(qg[:, :, :hd], w(p + "attn_q_norm.weight"), c.rms_eps)
        k = ops.rmsnorm(k.reshape(n, c.n_head_kv, hd), w(p + "attn_k_norm.weight"), c.rms_eps)
        v = v.reshape(n, c.n_head_kv, c.head_dim_v)
        cos, sin = step.rope(c.rope_dim, c.rope_theta)
        q = ops.rope_neox(q, cos, sin)
        k = ops.rope_neox(k, cos, sin)
        a = self.attend(il, q, k, v, step, scale=1.0 / np.sqrt(hd)) * sigmoid(gate)
        return ops.linear(a, w(p + "attn_output.weight"))

    def ffn(self, il: int, h: np.ndarray) -> np.ndarray:
        w, p = self.w.get, f"blk.{il}."
        f = ops.swiglu(ops.linear(h, w(p + "ffn_gate.weight")), ops.linear(h, w(p + "ffn_up.weight")))
        return ops.linear(f, w(p + "ffn_down.weight"))

    def moe(self, il: int, h: np.ndarray) -> np.ndarray:
        """Softmax over all experts, the top k (ties to the lower id), weights renormalized over
        those k; plus the shared expert times sigmoid(h . ffn_gate_inp_shexp)."""
        e, w, p = self.config.extra, self.w.get, f"blk.{il}."
        logits = ops.linear(h, w(p + "ffn_gate_inp.weight"))
        probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        top = np.argsort(-probs, axis=-1, kind="stable")[:, :e["n_expert_used"][il]]
        weights = np.take_along_axis(probs, top, axis=-1)
        weights /= weights.sum(axis=-1, keepdims=True)
        if p + "ffn_gate_up_exps.weight" in self.w:  # converted with --fuse-gate-up-exps
            gate_up = w(p + "ffn_gate_up_exps.weight")  # (E, 2F, D): [gate | up] rows
            f = gate_up.shape[1] // 2
            gate_w, up_w = gate_up[:, :f], gate_up[:, f:]
        else:
            gate_w, up_w = w(p + "ffn_gate_exps.weight"), w(p + "ffn_up_exps.weight")  # (E, F, D)
        down_w = w(p + "ffn_down_exps.weight")  # (E, D, F)
        out = np.zeros_like(h)
        for x in np.unique(top):
            rows, slot = np.nonzero(top == x)
            hx = h[rows]
            y = ops.linear(ops.swiglu(ops.linear(hx, gate_w[x]), ops.linear(hx, up_w[x])), down_w[x])
            out[rows] += y * weights[rows, slot][:, None]
        if p + "ffn_up_shexp.weight" in self.w:
            s = ops.swiglu(ops.linear(h, w(p + "ffn_gate_shexp.weight")), ops.linear(h, w(p + "ffn_up_shexp.weight")))
            s = ops.linear(s, w(p + "ffn_down_shexp.weight"))
            out += s * sigmoid(ops.linear(h, w(p + "ffn_gate_inp_shexp.weight").reshape(1, -1)))
        return out

    def head(self, x: np.ndarray) -> np.ndarray:
        h = ops.rmsnorm(x, self.w.get("output_norm.weight"), self.config.rms_eps)
        return self.lm_head(h)
