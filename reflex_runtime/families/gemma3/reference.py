"""Gemma 3 (text) in numpy (the layer diagram and llama.cpp's conventions are in config.py):
    x = embed * sqrt(n_embd); x += post_norm(attention(norm(x))); x += post_norm(geglu_ffn(norm(x)))"""

from __future__ import annotations

import numpy as np

from ...modelfile import tensor_names as T
from ...reference import blocks, layers
from ...reference.base import ReferenceModel


class Gemma3(ReferenceModel):
    def embed(self, ids: np.ndarray) -> np.ndarray:
        return super().embed(ids) * np.float32(self.config.extra["embed_scale"])

    def layer(self, il: int, x: np.ndarray, step) -> np.ndarray:
        c, w, e = self.config, self.w.get, self.config.extra
        local = e["local_layers"][il]
        h = layers.rmsnorm(x, w(T.blk(il, T.ATTN_NORM)), c.rms_eps)
        a = blocks.self_attention(self, il, h, step, e["rope_theta_local"] if local else c.rope_theta, scale=1.0,
                                  window=e["sliding_window"] if local else 0, query_scale=e["query_scale"])
        x = x + layers.rmsnorm(a, w(T.blk(il, T.POST_ATTN_NORM)), c.rms_eps)
        h = layers.rmsnorm(x, w(T.blk(il, T.FFN_NORM)), c.rms_eps)
        f = blocks.gated_ffn(self, il, h, act=layers.gelu_tanh)
        return x + layers.rmsnorm(f, w(T.blk(il, T.POST_FFN_NORM)), c.rms_eps)

    def head(self, x: np.ndarray) -> np.ndarray:
        return blocks.lm_head(self, x, softcap=self.config.extra.get("final_logit_softcap"))
