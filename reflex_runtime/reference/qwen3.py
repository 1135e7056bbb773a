"""Qwen3 dense in numpy (the layer diagram is in reflex_runtime/models/qwen3.py)."""

from __future__ import annotations

import numpy as np

from . import ops
from .base import ReferenceModel


class Qwen3(ReferenceModel):
    def layer(self, il: int, x: np.ndarray, step) -> np.ndarray:
        x = self.attention_block(il, x, step)
        c, w, p = self.config, self.w.get, f"blk.{il}."
        h = ops.rmsnorm(x, w(p + "ffn_norm.weight"), c.rms_eps)
        return x + self.ffn(il, h)

    def ffn(self, il: int, h: np.ndarray) -> np.ndarray:
        w, p = self.w.get, f"blk.{il}."
        f = ops.swiglu(ops.linear(h, w(p + "ffn_gate.weight")), ops.linear(h, w(p + "ffn_up.weight")))
        return ops.linear(f, w(p + "ffn_down.weight"))

    def attention_block(self, il: int, x: np.ndarray, step) -> np.ndarray:
        """x + attention(norm(x)): q/k/v, per-head QK-norm, NeoX RoPE, causal GQA (Qwen3 and Qwen3-MoE)."""
        c, w, n = self.config, self.w.get, x.shape[0]
        p = f"blk.{il}."
        h = ops.rmsnorm(x, w(p + "attn_norm.weight"), c.rms_eps)
        q = ops.linear(h, w(p + "attn_q.weight")).reshape(n, c.n_head, c.head_dim)
        k = ops.linear(h, w(p + "attn_k.weight")).reshape(n, c.n_head_kv, c.head_dim)
        v = ops.linear(h, w(p + "attn_v.weight")).reshape(n, c.n_head_kv, c.head_dim_v)
        if p + "attn_q_norm.weight" in self.w:
            q = ops.rmsnorm(q, w(p + "attn_q_norm.weight"), c.rms_eps)
            k = ops.rmsnorm(k, w(p + "attn_k_norm.weight"), c.rms_eps)
        cos, sin = step.rope(c.rope_dim, c.rope_theta)
        q = ops.rope_neox(q, cos, sin)
        k = ops.rope_neox(k, cos, sin)
        a = self.attend(il, q, k, v, step, scale=1.0 / np.sqrt(c.head_dim))
        return x + ops.linear(a, w(p + "attn_output.weight"))

    def head(self, x: np.ndarray) -> np.ndarray:
        h = ops.rmsnorm(x, self.w.get("output_norm.weight"), self.config.rms_eps)
        return self.lm_head(h)
