"""Llama on the GPU: Qwen3's dense layer (gpu/blocks.py Attention + GatedFFN) without q/k norms,
with pairwise rope and Llama 3's per-pair frequency factors (the layer diagram is in config.py):

    x += Wo attention(norm(x))                       residual add fused into the output projection
    x += down(silu(gate norm(x)) * up norm(x))       residual add fused into the down projection
"""

from __future__ import annotations

from ... import tensor_names as T
from ...gpu.blocks import Attention
from ..qwen3.gpu import Layer, Qwen3Gpu


class LlamaGpu(Qwen3Gpu):
    def plan(self) -> None:
        c, e = self.cfg, self.cfg.extra
        self.need(Attention.buffers(c, self.max_batch))
        factors = T.ROPE_FREQS if e["rope_factors"] else None
        self.layers = [Layer(Attention(self, il, c.rope_theta, rope_pairs=True, rope_freq_scale=e["rope_freq_scale"],
                                       rope_factors=factors), self.plan_ffn(il)) for il in range(c.n_layers)]
