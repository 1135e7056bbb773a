"""Qwen3-MoE on the GPU: Qwen3's layer, with the routed experts (gpu/moe.py) as its FFN:

    x += Wo attention(norm(x))
    x += sum over the token's top-k experts e of weight_e * down_e(silu(gate_e h) * up_e h),  h = norm(x)
"""

from __future__ import annotations

from ...gpu.moe import MoeFFN, MoeWeights
from ..qwen3.gpu import Qwen3Gpu


class Qwen3MoeGpu(Qwen3Gpu):
    def plan_ffn(self, il: int):
        self.need(MoeFFN.buffers(self.cfg, self.max_batch))
        return MoeFFN(self)

    def bind_ffn(self, il: int, ffn) -> None:
        ffn.bind(self, MoeWeights.read(self.tensors, il))

    def unread_bytes_per_token(self) -> int:
        return sum(ly.ffn.unread_bytes() for ly in self.layers)
