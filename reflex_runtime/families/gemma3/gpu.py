"""Gemma 3 on the GPU (the layer diagram and llama.cpp's conventions are in config.py):

    x = embed * sqrt(n_embd)
    x += post_norm(Wo attention(norm(x)))        local layers: sliding window, local RoPE base
    x += post_norm(down(gelu(gate h) * up h)),   h = norm(x)
    logits = softcap(W_out norm(x))
Each post-norm, its residual add and the next block's pre-norm are one kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

from ... import tensor_names as T
from ...gpu.blocks import Attention, AttnWeights, Batch, FfnWeights, GatedFFN
from ...gpu.model import GpuModel


@dataclass
class Layer:
    attn: Attention
    ffn: GatedFFN
    attn_norm: int = 0
    post_attn_norm: int = 0
    ffn_norm: int = 0
    post_ffn_norm: int = 0


class Gemma3Gpu(GpuModel):
    def plan(self) -> None:
        c, ex = self.cfg, self.cfg.extra
        self.embed_scale = float(ex["embed_scale"])
        self.softcap = float(ex.get("final_logit_softcap") or 0.0)
        self.need(Attention.buffers(c, self.max_batch))
        self.need(GatedFFN.buffers(self.max_batch, c.n_ff))
        local = ex.get("local_layers") or (False,) * c.n_layers
        self.layers = []
        for il in range(c.n_layers):
            rope, window = (ex["rope_theta_local"], ex["sliding_window"]) if local[il] else (c.rope_theta, 0)
            # the query scale is folded into attention's score scale (the reference scales q)
            attn = Attention(self, il, rope, window, scale=ex["query_scale"])
            self.layers.append(Layer(attn, GatedFFN(self, c.n_ff, GatedFFN.GELU)))

    def bind_weights(self) -> None:
        r = self.tensors
        for il, ly in enumerate(self.layers):
            ly.attn_norm, ly.post_attn_norm = r.vector(T.blk(il, T.ATTN_NORM)), r.vector(T.blk(il, T.POST_ATTN_NORM), False)
            ly.ffn_norm, ly.post_ffn_norm = r.vector(T.blk(il, T.FFN_NORM)), r.vector(T.blk(il, T.POST_FFN_NORM), False)
            ly.attn.bind(self, AttnWeights.read(r, il))
            ly.ffn.bind(self, FfnWeights.read(r, il))

    def layer(self, il: int, b: Batch) -> None:
        ly, r = self.layers[il], self.res
        after = self.layers[il + 1].attn_norm if il + 1 < len(self.layers) else 0
        ly.attn(b, r.normed(b, ly.attn_norm), r.o, accumulate=False)
        r.add_normed(b, r.o, ly.post_attn_norm, next_w=ly.ffn_norm)
        ly.ffn(b, r.normed(b, ly.ffn_norm), r.o, accumulate=False)
        r.add_normed(b, r.o, ly.post_ffn_norm, next_w=after)
