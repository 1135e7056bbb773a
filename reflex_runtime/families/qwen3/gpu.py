"""Qwen3 dense on the GPU (the layer diagram is in config.py):

    x += Wo attention(norm(x))                       residual add fused into the output projection
    x += down(silu(gate norm(x)) * up norm(x))       residual add fused into the down projection
"""

from __future__ import annotations

from ...gpu.blocks import Attention, GatedFFN
from ...gpu.layer import DecoderLayer
from ...gpu.model import GpuModel


class Qwen3Gpu(GpuModel):
    def decoder_layer(self, il: int) -> DecoderLayer:
        c = self.cfg
        return DecoderLayer(Attention(self, il, c.rope_theta), GatedFFN(self, c.n_ff, GatedFFN.SILU))
