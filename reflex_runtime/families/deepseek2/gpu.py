"""DeepSeek-V2 / V2-Lite / V3 on the GPU (the layer diagram, routing rules and llama.cpp's
conventions are in config.py):

    x += Wo MLA(norm(x))                                    latent cache, absorbed form (gpu/mla.py)
    h = norm(x)
    x += down(silu(gate h) * up h)                          the first leading_dense_block_count layers
    x += sum_e w_e expert_e(h) + shared(h)                  the others: routed experts chosen on the
                                                            GPU (kernels/moe_route.cu), shared experts
The routed and shared experts both read h while adding into x, so h is written once per MoE
layer (not folded into their matrix kernels).
"""

from __future__ import annotations

from dataclasses import dataclass

from ... import tensor_names as T
from ...gpu.blocks import Batch, FfnWeights, GatedFFN, Input
from ...gpu.mla import LatentAttention, MlaWeights
from ...gpu.model import GpuModel
from ...gpu.moe import MoeFFN, MoeWeights
from .config import kv_cache_bytes_per_token, rope_frequencies

ROUTE_MAX_GROUPS = 64  # kernels/moe_route.cu


class DeepSeekMoE(MoeFFN):
    """The routed experts with DeepSeek's routing: V2's softmax (greedy or group-limited by the
    group max) or V3's sigmoid with the exp_probs_b correction and top-2-sum groups; weights
    normalized when the file says so, times expert_weights_scale."""

    def __init__(self, model):
        super().__init__(model)
        ex = model.cfg.extra
        self.sigmoid = ex["gating"] == "sigmoid"
        self.n_group = ex["n_group"] if ex["n_group"] > 1 else 1
        self.n_group_used = ex["n_group_used"] if self.n_group > 1 else 1
        self.top2 = ex["group_score"] == "top2"
        self.normalize, self.scale = bool(ex["weights_norm"]), float(ex["weights_scale"])
        self.bias = 0

    def bind_bias(self, bias: int) -> None:
        self.bias = bias  # exp_probs_b (0: none)

    def route(self, b: Batch, inp: Input, ids: int, wts: int, also=()) -> None:
        assert not also, "DeepSeek's shared experts are not gated"
        logits = self.p("moe_logits")
        self.launch.matmul_segments([self.w.router], inp.ptr, [logits], b.n, norm_w=inp.norm_w, eps=self.eps)
        self.launch.moe_route(logits, self.bias, b.n, self.n_expert, self.k, self.sigmoid, self.n_group,
                              self.n_group_used, self.top2, self.normalize, self.scale, ids, wts)


@dataclass
class Layer:
    attn: LatentAttention
    ffn: GatedFFN | None = None  # leading dense layers
    moe: DeepSeekMoE | None = None
    shared: GatedFFN | None = None  # shared experts, one SwiGLU of n_ff_exp * n_shared
    attn_norm: int = 0
    ffn_norm: int = 0


class DeepSeek2Gpu(GpuModel):
    def plan(self) -> None:
        c, ex, t = self.cfg, self.cfg.extra, self.max_batch
        freqs = rope_frequencies(ex, c.rope_theta)
        self.need(LatentAttention.buffers(c, t))
        n_shared_ff = ex["n_ff_exp"] * ex["n_expert_shared"]
        self.layers = []
        for il in range(c.n_layers):
            ly = Layer(LatentAttention(self, il, freqs))
            if il < ex["n_dense_lead"]:
                self.need(GatedFFN.buffers(t, c.n_ff))
                ly.ffn = GatedFFN(self, c.n_ff, GatedFFN.SILU)
            else:
                self.need(MoeFFN.buffers(c, t))
                ly.moe = DeepSeekMoE(self)
                if n_shared_ff:
                    self.need(GatedFFN.buffers(t, n_shared_ff))
                    ly.shared = GatedFFN(self, n_shared_ff, GatedFFN.SILU)
            self.layers.append(ly)

    def bind_weights(self) -> None:
        r, c = self.tensors, self.cfg
        for il, ly in enumerate(self.layers):
            ly.attn_norm, ly.ffn_norm = r.vector(T.blk(il, T.ATTN_NORM)), r.vector(T.blk(il, T.FFN_NORM))
            ly.attn.bind(self, MlaWeights.read(r, il, c.n_head, c.extra))
            if ly.ffn is not None:
                ly.ffn.bind(self, FfnWeights.read(r, il))
                continue
            ly.moe.bind(self, MoeWeights.read(r, il))
            ly.moe.bind_bias(r.vector(T.blk(il, T.FFN_EXP_PROBS_B), required=False))
            if ly.shared is not None:
                ly.shared.bind(self, FfnWeights(r.matrix(T.blk(il, T.FFN_GATE_SHEXP)), r.matrix(T.blk(il, T.FFN_UP_SHEXP)),
                                                r.matrix(T.blk(il, T.FFN_DOWN_SHEXP))))

    def layer(self, il: int, b: Batch) -> None:
        ly, r = self.layers[il], self.res
        ly.attn(b, r.normed(b, ly.attn_norm), r.x, accumulate=True)
        r.added()
        if ly.ffn is not None:
            ly.ffn(b, r.normed(b, ly.ffn_norm), r.x, accumulate=True)
        else:
            h = r.normed(b, ly.ffn_norm, fold=False)  # both expert blocks read h while adding into x
            ly.moe(b, h, r.x)
            if ly.shared is not None:
                ly.shared(b, h, r.x, accumulate=True)
        r.added()

    def unread_bytes_per_token(self) -> int:
        return sum(ly.moe.unread_bytes() for ly in self.layers if ly.moe is not None)

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
    if ex["n_group"] > ROUTE_MAX_GROUPS:
        return f"{ex['n_group']} expert groups exceed the routing kernel's {ROUTE_MAX_GROUPS}"
    why = moe_unsupported(config)  # expert counts and sizes (the per-layer type check is below)
    if why or gguf is None:
        return why
    for il in range(ex["n_dense_lead"], c.n_layers):
        gate, up = (gguf.tensor(T.blk(il, name)).type_name for name in (T.FFN_GATE_EXPS, T.FFN_UP_EXPS))
        if gate != up:  # one expert kernel decodes gate and up rows with the same type and stride
            return f"layer {il} stores its expert gate as {gate} and up as {up}; the CUDA engine needs them alike"
    return None
