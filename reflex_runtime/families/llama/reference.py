"""Llama in numpy (the layer diagram and llama.cpp's conventions are in config.py):
    x += attention(norm(x)) (pairwise rope);  x += swiglu_ffn(norm(x));  logits = head(norm(x))"""

from __future__ import annotations

import numpy as np

from ...modelfile import tensor_names as T
from ...reference import blocks, layers
from ...reference.base import ReferenceModel


class Llama(ReferenceModel):
    def layer(self, il: int, x: np.ndarray, step) -> np.ndarray:
        c, w, e = self.config, self.w.get, self.config.extra
        factors = w(T.ROPE_FREQS) if e["rope_factors"] else None
        h = layers.rmsnorm(x, w(T.blk(il, T.ATTN_NORM)), c.rms_eps)
        x = x + blocks.self_attention(self, il, h, step, c.rope_theta, scale=1.0 / np.sqrt(c.head_dim), rope_pairs=True,
                                      rope_freq_scale=e["rope_freq_scale"], rope_factors=factors)
        h = layers.rmsnorm(x, w(T.blk(il, T.FFN_NORM)), c.rms_eps)
        return x + blocks.gated_ffn(self, il, h)
