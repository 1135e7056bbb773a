"""DeepSeek-V2 / V2-Lite / V3 on the GPU (the layer diagram, routing rules and llama.cpp's
conventions are in config.py):

    x += Wo MLA(norm(x))                                    latent cache, absorbed form (blocks.py)
    h = norm(x)
    x += down(silu(gate h) * up h)                          the first leading_dense_block_count layers
    x += sum_e w_e expert_e(h) + shared(h)                  the others: routed experts chosen on the
                                                            GPU (kernels/moe_route.cu), shared experts
The routed and shared experts both read h while adding into x, so h is written once per MoE
layer (not folded into their matrix kernels).
"""

from __future__ import annotations

from ...modelfile import tensor_names as T
from ...gpu.blocks import GatedFFN
from ...gpu.layer import DecoderLayer
from ...gpu.model import GpuModel
from ...gpu.ops import moe_route
from .blocks import ExpertsAndShared, LatentAttention
from .config import kv_cache_bytes_per_token, rope_frequencies


class DeepSeek2Gpu(GpuModel):
    def mixers_batch(self) -> bool:
        """The latent attention runs decode rows (each from its range's first slot) and prompt
        chunks in a range (the block table's entries from kv_base's on)."""
        return all(isinstance(ly.mixer, LatentAttention) for ly in self.layers)

    def plan(self) -> None:
        self.rope_freqs = rope_frequencies(self.cfg.extra, self.cfg.rope_theta)
        super().plan()

    def decoder_layer(self, il: int) -> DecoderLayer:
        c = self.cfg
        attn = LatentAttention(self, il, self.rope_freqs)
        dense = il < c.extra["n_dense_lead"]
        return DecoderLayer(attn, GatedFFN(self, c.n_ff, GatedFFN.SILU) if dense else ExpertsAndShared(self))

    def kv_cache_bytes_per_token(self) -> dict:
        """What one token of context costs in the latent cache, against an expanded MHA cache."""
        return kv_cache_bytes_per_token(self.cfg)


def unsupported(config, gguf=None) -> str | None:
    """None if the CUDA engine runs this DeepSeek file, else the one-line reason."""
    from ...gpu.moe import moe_unsupported

    c, ex = config, config.extra
    if c.n_embd % 32:
        return "hidden sizes must be multiples of 32"
    if ex["n_dense_lead"] and c.n_ff % 32:
        return "the dense FFN size must be a multiple of 32"
    why = LatentAttention.unsupported(c)
    if why or ex["n_dense_lead"] >= c.n_layers:
        return why
    if ex["n_group"] > moe_route.MAX_GROUPS:
        return f"{ex['n_group']} expert groups exceed the routing kernel's {moe_route.MAX_GROUPS}"
    why = moe_unsupported(config)  # expert counts and sizes (the per-layer type check is below)
    if why or gguf is None:
        return why
    for il in range(ex["n_dense_lead"], c.n_layers):
        gate, up = (gguf.tensor(T.blk(il, name)).type_name for name in (T.FFN_GATE_EXPS, T.FFN_UP_EXPS))
        if gate != up:  # one expert kernel decodes gate and up rows with the same type and stride
            return f"layer {il} stores its expert gate as {gate} and up as {up}; the CUDA engine needs them alike"
    return None
