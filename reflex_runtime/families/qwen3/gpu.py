"""Qwen3 dense on the GPU (the layer diagram is in config.py):

    x += Wo attention(norm(x))                       residual add fused into the output projection
    x += down(silu(gate norm(x)) * up norm(x))       residual add fused into the down projection
"""

from __future__ import annotations

from dataclasses import dataclass

from ... import tensor_names as T
from ...gpu.blocks import Attention, AttnWeights, Batch, FfnWeights, GatedFFN
from ...gpu.model import GpuModel


@dataclass
class Layer:
    attn: Attention
    ffn: object  # GatedFFN, or the MoE block in Qwen3-MoE
    attn_norm: int = 0
    ffn_norm: int = 0


class Qwen3Gpu(GpuModel):
    def plan(self) -> None:
        c = self.cfg
        self.need(Attention.buffers(c, self.max_batch))
        self.layers = [Layer(Attention(self, il, c.rope_theta), self.plan_ffn(il)) for il in range(c.n_layers)]

    def plan_ffn(self, il: int):
        self.need(GatedFFN.buffers(self.max_batch, self.cfg.n_ff))
        return GatedFFN(self, self.cfg.n_ff, GatedFFN.SILU)

    def bind_weights(self) -> None:
        r = self.tensors
        for il, ly in enumerate(self.layers):
            ly.attn_norm, ly.ffn_norm = r.vector(T.blk(il, T.ATTN_NORM)), r.vector(T.blk(il, T.FFN_NORM))
            ly.attn.bind(self, AttnWeights.read(r, il))
            self.bind_ffn(il, ly.ffn)

    def bind_ffn(self, il: int, ffn) -> None:
        ffn.bind(self, FfnWeights.read(self.tensors, il))

    def layer(self, il: int, b: Batch) -> None:
        ly, r = self.layers[il], self.res
        ly.attn(b, r.normed(b, ly.attn_norm), r.x, accumulate=True)
        r.added()
        ly.ffn(b, r.normed(b, ly.ffn_norm), r.x, accumulate=True)
        r.added()
