"""The routed-expert FFN block (kernels/moe.cu): Qwen3-MoE's, and the routed part of the other
MoE families.

Routing is decided on the GPU (router logits in float32 through the matrix-vector kernel, then
softmax + top-k), so a decode step needs nothing from the host and stays one CUDA graph. The
experts are read in place from the stacked GGUF tensors: only the routed experts' rows.

  one token (decode):     router + top-k -> gate/up per slot -> down summed over the slots,
                          into x; each block's rows staged in shared memory      3 launches
                          (a shared expert of the experts' shape: one more slot of the last two)
  matrix-vector batches:  router (norm fused) -> top-k -> gate/up per (token, slot)
                                    -> down per token summed over its slots, into x       4 launches
  prefill (sm_80+):  norm -> router -> top-k -> group pairs by expert (and list 64-pair tiles)
            -> input rows to f16 -> gate+up+act (f16 rows), every expert in one grouped launch
            -> down, every expert in one launch, each token's weighted sum added to x in slot
            order (deterministic)                                                           7 launches
  prefill (older GPUs): ... group -> gate, up (WMMA) per expert -> act -> down -> combine     9 launches
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..modelfile import tensor_names as T
from ..errors import UnsupportedModelError
from . import products
from .blocks import Batch, Input, TensorReader
from .ops import gemm, moe_decode, mvs, norm
from .ops import moe as moe_ops
from .ops.common import Weight
from .ops.moe import MAX_EXPERTS, MoeGroups
# Experts per token. A policy with headroom (real models use 8-10): the hard limits are 256 (the
# top-k block normalizes with one thread per weight) and 127 (tokens x k in gridDim.y < 65536 for
# a 512-token batch on the per-pair kernels).
MAX_USED = 64


@dataclass
class SharedSlot:
    """A shared expert at decode (one token): its weights, its gate's logit (0: ungated), and how to
    run it by itself (gate_up(act), down(act)) where the routed launches cannot take it."""
    w: object  # blocks.FfnWeights
    logit: int
    gate_up: Callable[[int], None]
    down: Callable[[int], None]


def per_layer(value, il: int | None):
    """A config value that is one int for every layer or a tuple with one per layer (Qwen3.5)."""
    return value if isinstance(value, int) else (max(value) if il is None else value[il])


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

    @classmethod
    def read(cls, r: TensorReader, il: int) -> "MoeWeights":
        m = cls(r.matrix(T.blk(il, T.FFN_ROUTER)), r.matrix(T.blk(il, T.FFN_GATE_EXPS)),
                r.matrix(T.blk(il, T.FFN_UP_EXPS)), r.matrix(T.blk(il, T.FFN_DOWN_EXPS)))
        if (m.gate.type_name, m.gate.row_bytes) != (m.up.type_name, m.up.row_bytes):
            # one expert kernel decodes gate and up rows with the same type and stride
            raise UnsupportedModelError(f"blk.{il}.ffn_gate_exps is {m.gate.type_name} but ffn_up_exps is "
                                        f"{m.up.type_name}; the CUDA engine needs them alike")
        return m


def moe_unsupported(config, gguf=None) -> str | None:
    ex = config.extra
    used, n_ff = per_layer(ex["n_expert_used"], None), ex["n_ff_exp"]
    if ex["n_expert"] > MAX_EXPERTS:
        return f"{ex['n_expert']} experts exceed the router kernel's {MAX_EXPERTS}"
    if used > min(MAX_USED, ex["n_expert"]):
        return f"{used} experts per token exceed the CUDA engine's {MAX_USED}"
    if any(f % 32 for f in ((n_ff,) if isinstance(n_ff, int) else n_ff)):
        return "the expert FFN size must be a multiple of 32"
    for il in range(config.n_layers if gguf is not None else 0):
        if T.blk(il, T.FFN_GATE_UP_EXPS) in getattr(gguf, "tensors", {}):
            continue  # one fused tensor: gate and up alike
        gate, up = (gguf.tensor(T.blk(il, name)).type_name for name in (T.FFN_GATE_EXPS, T.FFN_UP_EXPS))
        if gate != up:  # one expert kernel decodes gate and up rows with the same type and stride
            return f"layer {il} stores its expert gate as {gate} and up as {up}; the CUDA engine needs them alike"
    return None


def router_logits(L, ws, x: int, ys: list[int], n: int, norm_w: int, eps: float, p=None) -> None:
    """ys[i] = ws[i] x' for n tokens, in float32 at every batch size (the tensor-core kernels round
    inputs to f16, which could flip a close top-k choice): a prompt's float32 router through
    moe_ops.router_mm (a tiled GEMM; p: the arena's pointers, for its K slices' scratch), anything
    else through the matrix-vector kernel."""
    scratch = (p("moe_router_part"), p("moe_router_counters")) if p else (0, 0)
    if not moe_ops.router_mm(L, ws, x, ys, n, norm_w, eps, scratch):
        products.segments(L, ws, x, ys, n, norm_w=norm_w, eps=eps)


class MoeFFN:
    """x += sum over the token's k routed experts of weight * expert(norm(x)), for one layer."""

    def __init__(self, model, act: int = 0, il: int | None = None):
        ex = model.cfg.extra
        self.n_embd, self.eps, self.act = model.cfg.n_embd, model.cfg.rms_eps, act
        self.n_expert = ex["n_expert"]
        self.k, self.n_ff = per_layer(ex["n_expert_used"], il), per_layer(ex["n_ff_exp"], il)
        self.normalize = bool(ex.get("norm_topk_prob", True))
        model.need(self.buffers(model.cfg, model.max_batch))
        self.w: MoeWeights | None = None

    @staticmethod
    def buffers(c, t: int) -> list[tuple[str, int]]:
        """(name, float32/int32 count) of the activations to reserve in the model's arena."""
        ex = c.extra
        n_expert, k, n_ff = ex["n_expert"], per_layer(ex["n_expert_used"], None), per_layer(ex["n_ff_exp"], None)
        pairs = t * k
        return [("moe_logits", t * n_expert), ("moe_ids", pairs), ("moe_w", pairs),
                ("moe_counts", n_expert), ("moe_offsets", n_expert), ("moe_pair_tok", pairs),
                ("moe_pair_id", pairs), ("moe_gate", pairs * n_ff), ("moe_up", pairs * n_ff),
                ("moe_act", max(pairs, k + 1) * n_ff),  # one token: a shared expert's slot too
                ("moe_xh", -(-t * c.n_embd // 2)),  # the input rows in f16 (the grouped GEMMs)
                ("moe_out", pairs * c.n_embd),
                ("moe_tile_e", moe_ops.max_tiles(pairs, n_expert, moe_ops.SMALL_TILE)),
                ("moe_tile_m0", moe_ops.max_tiles(pairs, n_expert, moe_ops.SMALL_TILE)),
                ("moe_n_tiles", 1), ("moe_counters", t * gemm.down_col_tiles(c.n_embd)),
                *moe_ops.router_mm_scratch()]

    def bind(self, model, il: int, weights: MoeWeights | None = None) -> None:
        """Layer il's experts (weights: read another way, e.g. views of a fused tensor)."""
        self.w, self.p, self.launch = weights or MoeWeights.read(model.tensors, il), model.p, model.launch
        self.il, self.owner = il, model  # owner.residency: experts on demand (gpu/residency.py)

    def grouped(self) -> str | None:
        """Which tensor-core expert path the weights allow: "gemm" (sm_80+, gemm.cu), "wmma"
        (matmul.cu's tiles: rows of a multiple of 64 weights on both sides), or None."""
        m, L = self.w, self.launch
        if all(gemm.ok(L, w) for w in (m.gate, m.up, m.down)):
            return "gemm"
        return "wmma" if m.gate.k % 64 == 0 and m.down.k % 64 == 0 else None

    def unread_bytes(self) -> int:
        """Expert bytes a token does not read (the n_expert - k experts the router skips)."""
        m = self.w
        return (self.n_expert - self.k) * (2 * m.gate_up_stride + m.down_stride)

    def route(self, b: Batch, inp: Input, ids: int, wts: int, also=()) -> None:
        """ids/wts (b.n x k): each token's experts and weights. Softmax top-k here (Qwen3-MoE);
        a family with another rule overrides this and keeps the expert kernels below.
        also: up to two more (Weight, y) products of the same input (a shared expert's gate),
        run in the router's launch when their type and row length match it."""
        L, m, n = self.launch, self.w, b.n
        logits = self.p("moe_logits")
        # One token: router and top-k in one launch (kernels/moe_decode.cu, float routers), a
        # shared expert's gate in one more block of it
        if n == 1 and moe_decode.router_topk(L, m.router, inp.ptr, inp.norm_w, self.eps, logits, self.k,
                                             self.normalize, ids, wts, self.p("mvs_counters") + 4, also=also):
            return
        same = [(w, y) for w, y in also if (w.type_name, w.k) == (m.router.type_name, m.router.k)]
        router_logits(L, [m.router] + [w for w, _ in same], inp.ptr, [logits] + [y for _, y in same], n,
                      inp.norm_w, self.eps, self.p)
        for w, y in also:
            if (w, y) not in same:
                products.segments(L, [w], inp.ptr, [y], n, norm_w=inp.norm_w, eps=self.eps)
        moe_ops.topk(L, logits, n, self.n_expert, self.k, self.normalize, ids, wts)

    def _one_token(self, inp: Input, x: int, ids: int, wts: int, shared: SharedSlot | None) -> None:
        """The routed rows staged in shared memory; down may stage its rows before it waits, since a
        gate/up launch always sits between it and the top-k that wrote the ids. A shared expert of
        the experts' shape is one more slot of both launches; else it runs by itself, its gate/up
        before the routed down adds into the residual stream."""
        L, p, m, k, act = self.launch, self.p, self.w, self.k, self.p("moe_act")
        ride = shared is not None and all(mvs.slot_fits(w, e, rows) for w, e, rows in (
            (shared.w.gate, m.gate, self.n_ff), (shared.w.up, m.up, self.n_ff), (shared.w.down, m.down, self.n_embd)))
        both = (shared.w.gate.nbytes + shared.w.up.nbytes) if ride else 0
        with L.role("moe experts gate/up + act", 2 * k * m.gate_up_stride + both):
            fused = ride and mvs.expert_glu(L, m.gate, m.up, m.gate_up_stride, ids, k, inp.ptr, act, self.n_ff,
                                            self.act, inp.norm_w, self.eps, shared=(shared.w.gate, shared.w.up))
            if not fused and not mvs.expert_glu(L, m.gate, m.up, m.gate_up_stride, ids, k, inp.ptr, act, self.n_ff,
                                                self.act, inp.norm_w, self.eps):
                moe_ops.glu_mv(L, m.gate, m.up, m.gate_up_stride, ids, k, inp.ptr, act, 1, self.n_ff, self.act,
                               inp.norm_w, self.eps)
        if shared is not None and not fused:
            shared.gate_up(p("act"))
        with L.role("moe experts down (+residual)", k * m.down_stride + (shared.w.down.nbytes if fused else 0)):
            done = fused and moe_decode.down(L, m.down, m.down_stride, ids, wts, k, act, x, self.n_embd, early=True,
                                             shared=shared.w.down, shared_logit=shared.logit)
            if not done and not moe_decode.down(L, m.down, m.down_stride, ids, wts, k, act, x, self.n_embd,
                                                early=True):
                moe_ops.down_mv(L, m.down, m.down_stride, ids, wts, k, act, x, 1, self.n_embd)
        if shared is not None and not done:
            shared.down(act + 4 * k * self.n_ff if fused else p("act"))

    def __call__(self, b: Batch, inp: Input, out: int, accumulate: bool = True, also=(),
                 shared: SharedSlot | None = None) -> None:
        """out += MoE(input) for b.n tokens (the kernels add into out: the residual stream);
        `also` as in route(); shared: a shared expert to add too (one token only)."""
        assert shared is None or b.n == 1, "a shared expert rides along at decode only"
        assert accumulate, "the expert kernels add into their output"
        x = out
        L, p, m, k, E, n = self.launch, self.p, self.w, self.k, self.n_embd, b.n
        ids, wts = p("moe_ids"), p("moe_w")
        with L.role("moe router + top-k", m.router.nbytes):
            self.route(b, inp, ids, wts, also)
        ws = self.owner.residency
        if ws is not None and not ws.complete:  # wait for the routed experts (never in a graph: see runner._graph)
            ws.ensure_routed(L, self.il, ids, n * k)
        if n == 1:
            self._one_token(inp, x, ids, wts, shared)
            return
        # the grouped kernels from products.MM_MIN_TOKENS on, as the dense products (the 30B-A3B shape, 8
        # layers, whole prompt on the GPU: 32 tokens 2.29 ms against 4.97 per token; H100, s38)
        path = None if b.matvec else self.grouped()
        if path is None:
            with L.role("moe experts gate/up + act", 2 * k * m.gate_up_stride):
                moe_ops.glu_mv(L, m.gate, m.up, m.gate_up_stride, ids, k, inp.ptr, p("moe_act"), n, self.n_ff,
                               self.act, inp.norm_w, self.eps)
            with L.role("moe experts down (+residual)", k * m.down_stride):
                moe_ops.down_mv(L, m.down, m.down_stride, ids, wts, k, p("moe_act"), x, n, E)
            return
        counts, offsets, pair_tok, pair_id = p("moe_counts"), p("moe_offsets"), p("moe_pair_tok"), p("moe_pair_id")
        if path == "gemm":  # two grouped launches
            tile = moe_ops.tile_for(L)
            grp = MoeGroups(counts, offsets, pair_tok, pair_id, p("moe_tile_e"), p("moe_tile_m0"), p("moe_n_tiles"),
                            moe_ops.max_tiles(n * k, self.n_expert, tile), tile)
            moe_ops.group(L, ids, n * k, self.n_expert, k, counts, offsets, pair_tok, pair_id, grp.tile_e,
                          grp.tile_m0, grp.n_tiles, tile)
            with L.role("moe experts gate/up + act", 2 * self.n_expert * m.gate_up_stride):
                gemm.to_half(L, inp.ptr, p("moe_xh"), n * E)  # f16 input rows; moe_act gets f16 rows too
                gemm.moe_glu(L, m.gate, m.up, m.gate_up_stride, self.n_ff, grp, p("moe_xh"), p("moe_act"), self.act)
            with L.role("moe experts down (+residual)", self.n_expert * m.down_stride):
                gemm.moe_down(L, m.down, m.down_stride, E, grp, p("moe_act"), wts, k, p("moe_out"), x,
                              p("moe_counters"))
            return
        moe_ops.group(L, ids, n * k, self.n_expert, k, counts, offsets, pair_tok, pair_id)
        for w, out in ((m.gate, p("moe_gate")), (m.up, p("moe_up"))):
            moe_ops.mm(L, w, m.gate_up_stride, self.n_expert, self.n_ff, counts, offsets, pair_tok, pair_id, inp.ptr,
                       out)
        norm.glu(L, p("moe_gate"), p("moe_up"), p("moe_act"), n * k * self.n_ff, self.act)
        moe_ops.mm(L, m.down, m.down_stride, self.n_expert, E, counts, offsets, pair_id, pair_id, p("moe_act"),
                   p("moe_out"))
        moe_ops.combine(L, p("moe_out"), wts, k, x, E, n)
