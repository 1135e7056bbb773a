"""DeepSeek's own GPU blocks (the shared ones are gpu/blocks.py and gpu/moe.py):

  LatentAttention  multi-head latent attention (MLA, kernels/mla.cu) over a latent KV cache
  DeepSeekMoE      the routed experts with DeepSeek's routing (kernels/moe_route.cu)
  ExpertsAndShared the routed experts plus the shared ones, both reading one normalized input

Multi-head latent attention (DeepSeek-V2/V3 MLA) over a latent KV cache.

Per token the cache keeps only [c (kv_lora_rank) | k_pe (qk_rope)] in f16, one row shared by
every head (the layer diagram is in families/deepseek2/config.py). Every batch runs the absorbed
form, prompts included (llama.cpp's choice too): on tensor cores a latent row is one 576-wide key
shared by every head, and the expanded form's per-head keys would need the split files' W_k^T
transposed first:

    q      attn_q x', or attn_q_b rmsnorm(attn_q_a x')       (q_a and kv_a share one launch)
    kv     attn_kv_a_mqa x' = [c | k_pe]
    rope   q_pe -> qm[:, :, r:]; rmsnorm(c), rope(k_pe) -> the cache slot         1 launch
    absorb qm[:, :, :r] = W_k[h]^T q_nope per head                                1 launch
    attend att = softmax(qm . cache rows * kq_scale) . c per head                 1 launch
           (prompts and trees on tensor cores, kernels/mla_flash.cu; decode in key slices, mla.cu)
    up     o = W_v[h] att per head                                                1 launch
    out    x += attn_output o                                                     1 launch

W_k and W_v are read in place: split files store attn_k_b (per head W_k^T, rows of qk_nope)
and attn_v_b (per head W_v, rows of kv_lora_rank); legacy files one attn_kv_b with rows per head
[W_k | W_v] (rows of kv_lora_rank), whose W_k side runs the transposed kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...modelfile import tensor_names as T
from ...gpu import products
from ...gpu.blocks import Batch, FfnWeights, GatedFFN, Input, TensorReader
from ...gpu.moe import MoeFFN, router_logits
from ...gpu.ops import mla, mla_flash, moe_route, norm
from ...gpu.ops.common import Weight
from ...gpu.ops.mla import MlaRope


@dataclass(frozen=True)
class HeadMatrix:
    """One matrix per head: head h's rows start at w.ptr + h * head_bytes; w.rows is per head."""

    w: Weight
    head_bytes: int


@dataclass(frozen=True)
class MlaWeights:
    q: Weight | None  # attn_q (no q_lora)
    q_a: Weight | None  # attn_q_a, attn_q_a_norm, attn_q_b (q_lora)
    q_a_norm: int
    q_b: Weight | None
    kv_a: Weight  # attn_kv_a_mqa: kv_lora_rank + qk_rope rows
    kv_a_norm: int
    k_b: HeadMatrix  # split: W_k[h]^T (kv_lora_rank rows of qk_nope); legacy: W_k[h] (qk_nope rows of kv_lora_rank)
    k_b_transposed: bool  # legacy layout: absorb with the transposed product
    v_b: HeadMatrix  # W_v[h]: v_head_dim rows of kv_lora_rank
    o: Weight

    @classmethod
    def read(cls, r: TensorReader, il: int, n_head: int, extra: dict) -> "MlaWeights":
        nope, v = extra["qk_nope"], extra["v_head_dim"]
        if extra["q_lora_rank"]:
            q, q_a, q_b = None, r.matrix(T.blk(il, T.ATTN_Q_A)), r.matrix(T.blk(il, T.ATTN_Q_B))
            q_a_norm = r.vector(T.blk(il, T.ATTN_Q_A_NORM))
        else:
            q, q_a, q_b, q_a_norm = r.matrix(T.blk(il, T.ATTN_Q)), None, None, 0
        if extra["kv_b_split"]:
            k_b, v_b = r.matrix(T.blk(il, T.ATTN_K_B)), r.matrix(T.blk(il, T.ATTN_V_B))
            k_rows, v_rows = k_b.rows // n_head, v_b.rows // n_head
            k_head = HeadMatrix(replace(k_b, rows=k_rows), k_rows * k_b.row_bytes)
            v_head = HeadMatrix(replace(v_b, rows=v_rows), v_rows * v_b.row_bytes)
            transposed = False
        else:  # rows per head [W_k (qk_nope) | W_v (v_head_dim)], each of kv_lora_rank: views, no copy
            kv = r.matrix(T.blk(il, T.ATTN_KV_B))
            stride = (nope + v) * kv.row_bytes
            k_head = HeadMatrix(replace(kv, rows=nope), stride)
            v_head = HeadMatrix(replace(kv, ptr=kv.ptr + nope * kv.row_bytes, rows=v), stride)
            transposed = True
        return cls(q, q_a, q_a_norm, q_b, r.matrix(T.blk(il, T.ATTN_KV_A_MQA)), r.vector(T.blk(il, T.ATTN_KV_A_NORM)),
                   k_head, transposed, v_head, r.matrix(T.blk(il, T.ATTN_OUT)))


class LatentAttention:
    """out (+)= Wo MLA(input) for one layer; its latent cache (kv_rows rows of kv_lora_rank + qk_rope
    halves, GpuModel.paged) is a piece of the arena."""

    def __init__(self, model, il: int, rope_freqs: list[float]):
        c, e = model.cfg, model.cfg.extra
        self.cfg, self.il = c, il
        self.r, self.rope, self.nope, self.v = e["kv_lora_rank"], e["qk_rope"], e["qk_nope"], e["v_head_dim"]
        self.d = self.r + self.rope
        self.q_lora = e["q_lora_rank"]
        self.scale, self.attn_factor, self.eps = e["kq_scale"], e["rope_attn_factor"], c.rms_eps
        self.tab = MlaRope.of(rope_freqs)
        model.arena.reserve(f"mla{il}", model.kv_rows * self.d * 2)
        model.need(self.buffers(c, model.max_batch, model.max_seqs))
        self.w: MlaWeights | None = None

    @staticmethod
    def unsupported(c) -> str | None:
        e = c.extra
        r, rope, nope, v = e["kv_lora_rank"], e["qk_rope"], e["qk_nope"], e["v_head_dim"]
        if r % 32 or r > 512:
            return f"kv_lora_rank {r} is outside what the latent attention kernel handles (a multiple of 32, <= 512)"
        if rope % 8 or rope > 2 * mla.MAX_PAIRS:
            return f"rope dimension {rope} is outside what the latent attention kernel handles (a multiple of 8, <= 128)"
        if nope % 32 or v % 32 or e["q_lora_rank"] % 32:
            return "qk_nope, v_head_dim and q_lora_rank must be multiples of 32"
        return None

    @staticmethod
    def buffers(c, t: int, rows: int = 1) -> list[tuple[str, int]]:
        """rows: decode tokens of that many sequences in one pass; each splits its keys into
        splits(rows) slices, rows x splits(rows) <= max(SPLITS_DECODE, rows) partials per head."""
        e, H = c.extra, c.n_head
        r, rope, nope, v = e["kv_lora_rank"], e["qk_rope"], e["qk_nope"], e["v_head_dim"]
        parts = max(mla.SPLITS_DECODE, rows)
        return [("q", t * H * (nope + rope)), ("mla_qa", t * max(e["q_lora_rank"], 1)), ("mla_kv", t * (r + rope)),
                ("mla_q", t * H * (r + rope)), ("mla_att", t * H * r), ("mla_o", t * H * v),
                ("mla_part_o", parts * H * r), ("mla_part_ml", parts * H * 2),
                # named like Attention's so GpuModel.bind zeroes them (the merges' per head group)
                ("attn_counters", max(rows * H, mla.counters(rows, H)))]

    @staticmethod
    def splits(rows: int) -> int:
        """Key slices per decode token when `rows` sequences decode in one pass."""
        return max(1, mla.SPLITS_DECODE // rows)

    def bind(self, model, il: int) -> None:
        c = model.cfg
        self.w, self.p, self.launch = MlaWeights.read(model.tensors, il, c.n_head, c.extra), model.p, model.launch
        self.cache = model.p(f"mla{self.il}")
        self.kv_table = model.kv_table

    def __call__(self, b: Batch, inp: Input, out: int, accumulate: bool) -> None:
        c, L, p, w = self.cfg, self.launch, self.p, self.w
        H, r, d, n = c.n_head, self.r, self.d, b.n
        q, kv, qm, att, o = p("q"), p("mla_kv"), p("mla_q"), p("mla_att"), p("mla_o")
        self._project(b, inp, q, kv)
        cache = self.cache
        blocks = self.kv_table(b.kv_base)  # a prompt chunk of one sequence: its slots count from kv_base
        with L.role("mla rope + latent cache store"):
            mla.rope_store(L, q, qm, kv, w.kv_a_norm, b.pos, b.slot, cache, self.tab, self.attn_factor, n, H,
                           self.nope, self.rope, r, self.eps, blocks=blocks)
        qk = self.nope + self.rope
        with L.role("mla q absorb (W_k)", w.k_b.w.nbytes * H):
            if w.k_b_transposed:
                mla.heads_t(L, w.k_b.w, w.k_b.head_bytes, q, H * qk, qk, qm, H * d, d, n, H)
            else:
                mla.heads(L, w.k_b.w, w.k_b.head_bytes, q, H * qk, qk, qm, H * d, d, n, H, tensor_cores=not b.matvec)
        with L.role("mla attention"):
            if mla_flash.ok(L, n, r, d, b.rows):
                mla_flash.attention(L, qm, cache, b.slot, b.seg_lo, b.prefix_len, b.n_kv, att, n, H, self.scale,
                                    blocks=blocks)
            else:
                n_split = self.splits(n) if n == 1 or b.rows else 1  # decode rows: each its own range from seg_lo
                mla.attention(L, qm, cache, b.slot, b.seg_lo, b.prefix_len, b.n_kv, att, p("mla_part_o"),
                              p("mla_part_ml"), p("attn_counters"), n, H, r, d, self.scale, n_split, blocks=blocks)
        with L.role("mla v up (W_v)", w.v_b.w.nbytes * H):
            mla.heads(L, w.v_b.w, w.v_b.head_bytes, att, H * r, r, o, H * self.v, self.v, n, H,
                      tensor_cores=not b.matvec)
        with L.role("attn output", w.o.nbytes):
            products.matmul(L, w.o, o, out, n, accumulate=accumulate)

    def _project(self, b: Batch, inp: Input, q: int, kv: int) -> None:
        """q (n x H(qk_nope + qk_rope)) and kv (n x (kv_lora_rank + qk_rope)) from the input; the
        two input-side matrices share a launch when their types agree (either path)."""
        L, w, n = self.launch, self.w, b.n
        first = w.q_a if self.q_lora else w.q
        first_out = self.p("mla_qa") if self.q_lora else q
        ws = [first, w.kv_a]
        with L.role("mla q/kv_a", sum(x.nbytes for x in ws)):
            products.matmul_many(L, ws, inp.ptr, [first_out, kv], n, norm_w=inp.norm_w, eps=self.eps)
        if not self.q_lora:
            return
        qa = self.p("mla_qa")
        with L.role("mla q_b", w.q_b.nbytes):
            if b.matvec:  # the q_a norm folds into the matrix-vector kernel
                products.matmul(L, w.q_b, qa, q, n, norm_w=w.q_a_norm, eps=self.eps)
            else:
                # in place: rows are reduced before they are written
                norm.rmsnorm(L, qa, w.q_a_norm, qa, n, self.q_lora, self.eps)
                products.matmul(L, w.q_b, qa, q, n)


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

    def bind(self, model, il: int, weights=None) -> None:
        super().bind(model, il, weights)
        self.bias = model.tensors.vector(T.blk(il, T.FFN_EXP_PROBS_B), required=False)  # exp_probs_b (0: none)

    def route(self, b: Batch, inp: Input, ids: int, wts: int, also=()) -> None:
        assert not also, "DeepSeek's shared experts are not gated"
        logits = self.p("moe_logits")
        router_logits(self.launch, [self.w.router], inp.ptr, [logits], b.n, inp.norm_w, self.eps, self.p)
        moe_route.route(self.launch, logits, self.bias, b.n, self.n_expert, self.k, self.sigmoid, self.n_group,
                        self.n_group_used, self.top2, self.normalize, self.scale, ids, wts)


class ExpertsAndShared:
    """x += routed experts(h) + shared experts(h), h = norm(x): both read h while adding into x,
    so the pre-norm writes h once (fold_input) instead of folding into their matrix kernels."""

    fold_input = False

    def __init__(self, model):
        ex = model.cfg.extra
        self.moe = DeepSeekMoE(model)
        n_shared_ff = ex["n_ff_exp"] * ex["n_expert_shared"]  # the shared experts: one SwiGLU of this size
        self.shared = GatedFFN(model, n_shared_ff, GatedFFN.SILU, names=FfnWeights.SHARED_EXPERT) \
            if n_shared_ff else None

    def bind(self, model, il: int) -> None:
        self.moe.bind(model, il)
        if self.shared is not None:
            self.shared.bind(model, il)

    def unread_bytes(self) -> int:
        return self.moe.unread_bytes()

    def __call__(self, b: Batch, inp: Input, out: int, accumulate: bool = True) -> None:
        self.moe(b, inp, out)
        if self.shared is not None:
            self.shared(b, inp, out, accumulate=True)
