"""Qwen3-MoE on the GPU: Qwen3's layer, with the routed experts (gpu/moe.py) as its FFN:

    x += Wo attention(norm(x))
    x += sum over the token's top-k experts e of weight_e * down_e(silu(gate_e h) * up_e h),  h = norm(x)
"""

from __future__ import annotations

from ...gpu.blocks import Attention
from ...gpu.layer import DecoderLayer
from ...gpu.model import GpuModel
from ...gpu.moe import MoeFFN


class Qwen3MoeGpu(GpuModel):
    def decoder_layer(self, il: int) -> DecoderLayer:
        return DecoderLayer(Attention(self, il, self.cfg.rope_theta), MoeFFN(self))
