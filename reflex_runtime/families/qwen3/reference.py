"""Qwen3 dense in numpy (the layer diagram is in config.py):
    x += attention(norm(x));  x += swiglu_ffn(norm(x));  logits = head(norm(x))"""

from __future__ import annotations

import numpy as np

from ...modelfile import tensor_names as T
from ...reference import blocks, layers
from ...reference.base import ReferenceModel


class Qwen3(ReferenceModel):
    def layer(self, il: int, x: np.ndarray, step) -> np.ndarray:
        c, w = self.config, self.w.get
        h = layers.rmsnorm(x, w(T.blk(il, T.ATTN_NORM)), c.rms_eps)
        x = x + blocks.self_attention(self, il, h, step, c.rope_theta, scale=1.0 / np.sqrt(c.head_dim))
        h = layers.rmsnorm(x, w(T.blk(il, T.FFN_NORM)), c.rms_eps)
        return x + self.ffn(il, h)

    def ffn(self, il: int, h: np.ndarray) -> np.ndarray:
        return blocks.gated_ffn(self, il, h)
