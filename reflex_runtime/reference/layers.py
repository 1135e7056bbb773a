"""The numpy ops the reference forward is made of. float32 in, float32 out."""

from __future__ import annotations

import numpy as np

_F32 = np.float32


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * w over the last axis (w already includes any +1 shift)."""
    ms = np.mean(np.square(x), axis=-1, keepdims=True, dtype=_F32)
    return (x * (1.0 / np.sqrt(ms + _F32(eps)))).astype(_F32, copy=False) * w


def rope_cos_sin(positions: np.ndarray, rope_dim: int, theta: float, freq_scale: float = 1.0,
                 factors: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin (n, rope_dim/2) of each rotation pair i: angle_i = pos * freq_scale *
    theta^(-2i/rope_dim) / factors[i] (freq_scale = 1 / a linear scaling factor; factors: Llama
    3.1+'s per-pair rope_freqs, or None), computed in float64 and rounded once to float32."""
    inv_freq = float(theta) ** (-np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim) * float(freq_scale)
    if factors is not None:
        inv_freq = inv_freq / np.asarray(factors, dtype=np.float64).reshape(-1)[: rope_dim // 2]
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(ang).astype(_F32), np.sin(ang).astype(_F32)


def rope_pairs(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate adjacent pairs (x[2i], x[2i+1]) of the first rope_dim dims by the angle of pair i
    (llama.cpp's "normal" rope: Llama, DeepSeek's rope part); x is (n, heads, head_dim)."""
    d = 2 * cos.shape[-1]
    c, s = cos[:, None, :], sin[:, None, :]
    x0, x1 = x[..., 0:d:2], x[..., 1:d:2]
    out = x.copy()
    out[..., 0:d:2] = x0 * c - x1 * s
    out[..., 1:d:2] = x1 * c + x0 * s
    return out


def rope_neox(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate (x[i], x[i + d/2]) pairs of the first rope_dim dims; x is (n, heads, head_dim)."""
    half = cos.shape[-1]
    c = cos[:, None, :]
    s = sin[:, None, :]
    x1 = x[..., :half]
    x2 = x[..., half:2 * half]
    out = x.copy()
    out[..., :half] = x1 * c - x2 * s
    out[..., half:2 * half] = x2 * c + x1 * s
    return out


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, allowed: np.ndarray, scale: float) -> np.ndarray:
    """Grouped-query attention.

    q (n, H, d), k (T, Hkv, d), v (T, Hkv, dv), allowed bool (n, T) -> (n, H * dv).
    Query head h reads kv head h // (H / Hkv). A query row with no allowed key gets zeros."""
    n, n_head, d = q.shape
    t, n_kv, dv = v.shape
    group = n_head // n_kv
    qg = q.reshape(n, n_kv, group, d).transpose(1, 2, 0, 3).reshape(n_kv, group * n, d)
    scores = np.matmul(qg, k.transpose(1, 2, 0)) * _F32(scale)  # (Hkv, group*n, T)
    scores = scores.reshape(n_kv, group, n, t)
    scores = np.where(allowed[None, None], scores, _F32(-np.inf))
    smax = scores.max(axis=-1, keepdims=True)
    smax = np.where(np.isfinite(smax), smax, _F32(0.0))
    e = np.exp(scores - smax)
    denom = e.sum(axis=-1, keepdims=True)
    probs = (e / np.where(denom > 0, denom, _F32(1.0))).astype(_F32, copy=False)
    out = np.matmul(probs.reshape(n_kv, group * n, t), v.transpose(1, 0, 2))  # (Hkv, group*n, dv)
    return out.reshape(n_kv, group, n, dv).transpose(2, 0, 1, 3).reshape(n, n_head * dv)


def silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return x / (_F32(1.0) + np.exp(-x))


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    return silu(gate) * up


_GELU_C = _F32(np.sqrt(2.0 / np.pi))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return _F32(0.5) * x * (_F32(1.0) + np.tanh(_GELU_C * (x + _F32(0.044715) * x * x * x)))


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    """cap * tanh(x / cap)."""
    c = _F32(cap)
    return np.tanh(x / c) * c


def linear(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x (n, in) @ w.T with w in numpy order (out, in), as GGUF stores it (ggml ne = [in, out])."""
    return x @ w.T
