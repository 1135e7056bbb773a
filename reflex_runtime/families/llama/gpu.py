"""Llama on the GPU: Qwen3's dense layer (gpu/blocks.py Attention + GatedFFN) without q/k norms,
with pairwise rope and Llama 3's per-pair frequency factors (the layer diagram is in config.py):

    x += Wo attention(norm(x))                       residual add fused into the output projection
    x += down(silu(gate norm(x)) * up norm(x))       residual add fused into the down projection
"""

from __future__ import annotations

from ...modelfile import tensor_names as T
from ...gpu.blocks import Attention, GatedFFN
from ...gpu.layer import DecoderLayer
from ...gpu.model import GpuModel


class LlamaGpu(GpuModel):
    def decoder_layer(self, il: int) -> DecoderLayer:
        c, e = self.cfg, self.cfg.extra
        attn = Attention(self, il, c.rope_theta, rope_pairs=True, rope_freq_scale=e["rope_freq_scale"],
                         rope_factors=T.ROPE_FREQS if e["rope_factors"] else None)
        return DecoderLayer(attn, GatedFFN(self, c.n_ff, GatedFFN.SILU))
