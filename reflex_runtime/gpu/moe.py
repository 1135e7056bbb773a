"""The routed-expert FFN of Qwen3-MoE on the GPU (kernels/moe.cu), one per decoder.

Routing is decided on the GPU (router logits in float32 through the matrix-vector kernel, then
softmax + top-k), so a decode step needs nothing from the host and stays one CUDA graph. The
experts are read in place from the stacked GGUF tensors: only the routed experts' rows.

  small batches (< MM_MIN_TOKENS):  router (norm fused) -> top-k -> gate/up per (token, slot)
                                    -> down per token summed over its slots, into x       4 launches
  prefill:  norm -> router -> top-k -> group pairs by expert -> gate, up on tensor cores per
            expert over its gathered tokens -> act -> down likewise -> weighted sum into x  9 launches
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UnsupportedModelError
from .ops import MM_MIN_TOKENS, Ops, Weight

MAX_EXPERTS = 1024  # kernels/moe.cu MOE_MAX_EXPERTS (router probabilities live in shared memory)
# Experts per token. A policy with headroom (real models use 8-10): the hard limits are 256 (the
# top-k block normalizes with one thread per weight) and 127 (tokens x k in gridDim.y < 65536 for
# a 512-token batch on the per-pair kernels).
MAX_USED = 64


@dataclass(frozen=True)
class MoeWeights:
    router: Weight  # ffn_gate_inp, (n_expert, n_embd), float32
    gate: Weight  # ffn_gate_exps: n_expert stacked (n_ff, n_embd) matrices
    up: Weight
    down: Weight  # ffn_down_exps: n_expert stacked (n_embd, n_ff) matrices

    @property
    def gate_up_stride(self) -> int:
        return self.gate.row_bytes * (self.gate.rows // self.router.rows)

    @property
    def down_stride(self) -> int:
        return self.down.row_bytes * (self.down.rows // self.router.rows)


def moe_unsupported(config, gguf=None) -> str | None:
    ex = config.extra
    if ex["n_expert"] > MAX_EXPERTS:
        return f"{ex['n_expert']} experts exceed the router kernel's {MAX_EXPERTS}"
    if ex["n_expert_used"] > min(MAX_USED, ex["n_expert"]):
        return f"{ex['n_expert_used']} experts per token exceed the CUDA engine's {MAX_USED}"
    if ex["n_ff_exp"] % 32:
        return "the expert FFN size must be a multiple of 32"
    for il in range(config.n_layers if gguf is not None else 0):
        gate, up = (gguf.tensor(f"blk.{il}.ffn_{k}_exps.weight").type_name for k in ("gate", "up"))
        if gate != up:  # one expert kernel decodes gate and up rows with the same type and stride
            return f"layer {il} stores its expert gate as {gate} and up as {up}; the CUDA engine needs them alike"
    return None


class MoeFFN:
    def __init__(self, config, max_batch: int):
        ex = config.extra
        self.n_embd = config.n_embd
        self.n_expert, self.k, self.n_ff = ex["n_expert"], ex["n_expert_used"], ex["n_ff_exp"]
        self.normalize = bool(ex.get("norm_topk_prob", True))
        self.max_batch = max_batch

    def buffers(self) -> list[tuple[str, int]]:
        """(name, float32/int32 count) of the activations to reserve in the decoder's arena."""
        t, k = self.max_batch, self.k
        pairs = t * k
        return [("moe_logits", t * self.n_expert), ("moe_ids", pairs), ("moe_w", pairs),
                ("moe_counts", self.n_expert), ("moe_offsets", self.n_expert), ("moe_pair_tok", pairs),
                ("moe_pair_id", pairs), ("moe_gate", pairs * self.n_ff), ("moe_up", pairs * self.n_ff),
                ("moe_act", pairs * self.n_ff), ("moe_out", pairs * self.n_embd)]

    @staticmethod
    def bind(w, prefix: str) -> MoeWeights:
        m = MoeWeights(w(prefix + "ffn_gate_inp.weight"), w(prefix + "ffn_gate_exps.weight"),
                       w(prefix + "ffn_up_exps.weight"), w(prefix + "ffn_down_exps.weight"))
        if (m.gate.type_name, m.gate.row_bytes) != (m.up.type_name, m.up.row_bytes):
            # one expert kernel decodes gate and up rows with the same type and stride
            raise UnsupportedModelError(f"{prefix}ffn_gate_exps is {m.gate.type_name} but ffn_up_exps is "
                                        f"{m.up.type_name}; the CUDA engine needs them alike")
        return m

    def grouped(self, m: MoeWeights) -> bool:
        """The tensor-core path needs rows of a multiple of 64 weights on both sides."""
        return m.gate.k % 64 == 0 and m.down.k % 64 == 0

    def forward(self, ops: Ops, p, m: MoeWeights, x: int, h: int, n: int, act: int, norm_w: int, eps: float) -> None:
        """x += MoE(norm(x)) for n tokens. Small batches normalize on the fly (h unused); larger
        ones normalize x into h first."""
        k, E = self.k, self.n_embd
        ids, wts, logits = p("moe_ids"), p("moe_w"), p("moe_logits")
        small = n < MM_MIN_TOKENS
        if not small:
            ops.rmsnorm(x, norm_w, h, n, E, eps)
        src, nw = (x, norm_w) if small else (h, 0)
        # float32 router through the matrix-vector kernel at every batch size: the tensor-core
        # kernel rounds inputs to f16, which could flip a close top-k choice
        ops.matmul_segments([m.router], src, [logits], n, norm_w=nw, eps=eps)
        ops.moe_topk(logits, n, self.n_expert, k, self.normalize, ids, wts)
        if small or not self.grouped(m):
            ops.moe_glu_mv(m.gate, m.up, m.gate_up_stride, ids, k, src, p("moe_act"), n, self.n_ff, act, nw, eps)
            ops.moe_down_mv(m.down, m.down_stride, ids, wts, k, p("moe_act"), x, n, E)
            return
        counts, offsets, pair_tok, pair_id = p("moe_counts"), p("moe_offsets"), p("moe_pair_tok"), p("moe_pair_id")
        ops.moe_group(ids, n * k, self.n_expert, k, counts, offsets, pair_tok, pair_id)
        for w, out in ((m.gate, p("moe_gate")), (m.up, p("moe_up"))):
            ops.moe_mm(w, m.gate_up_stride, self.n_expert, self.n_ff, counts, offsets, pair_tok, pair_id, h, out)
        ops.glu(p("moe_gate"), p("moe_up"), p("moe_act"), n * k * self.n_ff, act)
        ops.moe_mm(m.down, m.down_stride, self.n_expert, E, counts, offsets, pair_id, pair_id, p("moe_act"),
                   p("moe_out"))
        ops.moe_combine(p("moe_out"), wts, k, x, E, n)
