"""Gemma 3 on the GPU (the layer diagram and llama.cpp's conventions are in config.py):

    x = embed * sqrt(n_embd)
    x += post_norm(Wo attention(norm(x)))        local layers: sliding window, local RoPE base
    x += post_norm(down(gelu(gate h) * up h)),   h = norm(x)
    logits = softcap(W_out norm(x))
Each post-norm, its residual add and the next block's pre-norm are one kernel (gpu/layer.py).
"""

from __future__ import annotations

from ...modelfile import tensor_names as T
from ...gpu.blocks import Attention, GatedFFN
from ...gpu.layer import DecoderLayer
from ...gpu.model import GpuModel


class Gemma3Gpu(GpuModel):
    def plan(self) -> None:
        ex = self.cfg.extra
        self.embed_scale = float(ex["embed_scale"])
        self.softcap = float(ex.get("final_logit_softcap") or 0.0)
        super().plan()

    def decoder_layer(self, il: int) -> DecoderLayer:
        c, ex = self.cfg, self.cfg.extra
        local = (ex.get("local_layers") or (False,) * c.n_layers)[il]
        rope, window = (ex["rope_theta_local"], ex["sliding_window"]) if local else (c.rope_theta, 0)
        # the query scale is folded into attention's score scale (the reference scales q)
        attn = Attention(self, il, rope, window, scale=ex["query_scale"])
        return DecoderLayer(attn, GatedFFN(self, c.n_ff, GatedFFN.GELU), post_norms=(T.POST_ATTN_NORM, T.POST_FFN_NORM))
