"""Gemma 3 (text) in numpy (the layer diagram and llama.cpp's conventions are in
reflex_runtime/models/gemma3.py)."""

from __future__ import annotations

import numpy as np

from . import ops
from .base import ReferenceModel


class Gemma3(ReferenceModel):
    def embed(self, ids: np.ndarray) -> np.ndarray:
        return super().embed(ids) * np.float32(self.config.extra["embed_scale"])

    def layer(self, il: int, x: np.ndarray, step) -> np.ndarray:
        c, w, n, e = self.config, self.w.get, x.shape[0], self.config.extra
        p = f"blk.{il}."
        local = e["local_layers"][il]
        h = ops.rmsnorm(x, w(p + "attn_norm.weight"), c.rms_eps)
        q = ops.linear(h, w(p + "attn_q.weight")).reshape(n, c.n_head, c.head_dim)
        k = ops.linear(h, w(p + "attn_k.weight")).reshape(n, c.n_head_kv, c.head_dim)
        v = ops.linear(h, w(p + "attn_v.weight")).reshape(n, c.n_head_kv, c.head_dim_v)
        q = ops.rmsnorm(q, w(p + "attn_q_norm.weight"), c.rms_eps)
        k = ops.rmsnorm(k, w(p + "attn_k_norm.weight"), c.rms_eps)
        cos, sin = step.rope(c.rope_dim, e["rope_theta_local"] if local else c.rope_theta)
        q = ops.rope_neox(q, cos, sin) * np.float32(e["query_scale"])
        k = ops.rope_neox(k, cos, sin)
        a = self.attend(il, q, k, v, step, scale=1.0, window=e["sliding_window"] if local else 0)
        a = ops.linear(a, w(p + "attn_output.weight"))
        x = x + ops.rmsnorm(a, w(p + "post_attention_norm.weight"), c.rms_eps)
        h = ops.rmsnorm(x, w(p + "ffn_norm.weight"), c.rms_eps)
        f = ops.gelu_tanh(ops.linear(h, w(p + "ffn_gate.weight"))) * ops.linear(h, w(p + "ffn_up.weight"))
        f = ops.linear(f, w(p + "ffn_down.weight"))
        return x + ops.rmsnorm(f, w(p + "post_ffw_norm.weight"), c.rms_eps)

    def head(self, x: np.ndarray) -> np.ndarray:
        h = ops.rmsnorm(x, self.w.get("output_norm.weight"), self.config.rms_eps)
        logits = self.lm_head(h)
        cap = self.config.extra.get("final_logit_softcap")
        return ops.softcap(logits, cap) if cap else logits
