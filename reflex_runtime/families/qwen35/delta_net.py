"""Gated DeltaNet pieces in numpy float32: the causal depthwise conv with its rolling state, the
L2 norm, and the gated delta rule in two forms that compute the same thing:

- `delta_rule_recurrent`: one token at a time (what decode does);
- `delta_rule_chunked`: the same recurrence solved a chunk of tokens at a time with matrix
  products (what prefill does); tests/test_reference_qwen35.py checks the two agree.

Shapes: q, k (n, H, dk) with q already L2-normalized and scaled; v (n, H, dv); log-decay g (n, H)
(<= 0); beta (n, H) in (0, 1); state S (H, dk, dv). Per token t and head:
    S <- exp(g_t) S;   d_t = beta_t (v_t - S^T k_t);   S <- S + k_t d_t^T;   o_t = S^T q_t.
"""

from __future__ import annotations

import numpy as np

_F32 = np.float32
CHUNK = 64


def causal_conv1d(x: np.ndarray, state: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Depthwise causal conv over time. x (n, C) new inputs; state (K-1, C) the inputs before
    them (zeros at the start); w (C, K), tap K-1 on the newest input. Returns (out (n, C), new
    state (K-1, C)): out_t = sum_j w[:, j] * xx[t + j] with xx = [state; x]."""
    n = x.shape[0]
    taps = w.shape[1]
    xx = np.concatenate([state, x], axis=0)
    out = np.zeros_like(x)
    for j in range(taps):
        out += xx[j:j + n] * w[:, j]
    return out, xx[xx.shape[0] - (taps - 1):].copy()


def l2norm(x: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(sum(x^2) + eps) over the last axis (llama.cpp uses the file's RMS epsilon here;
    transformers a fixed 1e-6: the same for Qwen3.5, whose epsilon is 1e-6)."""
    ss = np.sum(np.square(x), axis=-1, keepdims=True, dtype=_F32)
    return (x * (_F32(1.0) / np.sqrt(ss + _F32(eps)))).astype(_F32, copy=False)


def delta_rule_recurrent(q, k, v, g, beta, state):
    """Token by token. Returns (o (n, H, dv), final state)."""
    s = state.copy()
    out = np.empty(v.shape, dtype=_F32)
    decay = np.exp(g)
    for t in range(q.shape[0]):
        s *= decay[t][:, None, None]
        kv = np.einsum("hkv,hk->hv", s, k[t])
        d = (v[t] - kv) * beta[t][:, None]
        s += k[t][:, :, None] * d[:, None, :]
        out[t] = np.einsum("hkv,hk->hv", s, q[t])
    return out, s


def delta_rule_chunked(q, k, v, g, beta, state, chunk: int = CHUNK):
    """The same recurrence, `chunk` tokens at a time. Within a chunk with cumulative log-decay
    c_i = g_1 + ... + g_i and start state S0, the updates d_i satisfy
        d_i + beta_i sum_{j<i} exp(c_i - c_j) (k_i . k_j) d_j = beta_i (v_i - exp(c_i) S0^T k_i),
    a unit lower-triangular system; then
        o_i = exp(c_i) S0^T q_i + sum_{j<=i} exp(c_i - c_j) (q_i . k_j) d_j,
        S_end = exp(c_L) S0 + sum_j exp(c_L - c_j) k_j d_j^T."""
    s = state.copy()
    n = q.shape[0]
    out = np.empty(v.shape, dtype=_F32)
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        L = hi - lo
        qh = q[lo:hi].transpose(1, 0, 2)  # (H, L, dk)
        kh = k[lo:hi].transpose(1, 0, 2)
        vh = v[lo:hi].transpose(1, 0, 2)  # (H, L, dv)
        bh = beta[lo:hi].T  # (H, L)
        c = np.cumsum(g[lo:hi].T, axis=1, dtype=_F32)  # (H, L)
        lower = np.tril(np.ones((L, L), dtype=bool))
        diff = np.where(lower, c[:, :, None] - c[:, None, :], _F32(-np.inf))
        decay = np.exp(diff)  # (H, L, L): exp(c_i - c_j) for j <= i, else 0
        strict = decay * ~np.eye(L, dtype=bool)
        a = bh[:, :, None] * strict * np.matmul(kh, kh.transpose(0, 2, 1))
        ec = np.exp(c)[:, :, None]  # (H, L, 1)
        rhs = bh[:, :, None] * (vh - ec * np.matmul(kh, s))
        # I + a is unit lower-triangular with |a_ij| < 1: LU needs no row swaps, so this is the
        # triangular solve.
        d = np.linalg.solve(np.eye(L, dtype=_F32) + a, rhs).astype(_F32, copy=False)
        o = ec * np.matmul(qh, s) + np.matmul(decay * np.matmul(qh, kh.transpose(0, 2, 1)), d)
        out[lo:hi] = o.transpose(1, 0, 2)
        tail = np.exp(c[:, -1:] - c)[:, :, None]  # (H, L, 1): exp(c_L - c_j)
        s = np.exp(c[:, -1])[:, None, None] * s + np.matmul((kh * tail).transpose(0, 2, 1), d)
    return out, s.astype(_F32, copy=False)
