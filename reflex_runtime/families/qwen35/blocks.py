"""Qwen3.5's own GPU blocks (the shared ones are gpu/blocks.py and gpu/moe.py):

  DeltaNet        a Gated DeltaNet layer's token mixer (kernels/delta_net.cu): input projections,
                  causal conv + SiLU + q/k L2 norm, the gated delta rule (token by token for
                  short sequences, chunked for prompts) with the gated output norm, the output
                  projection into the residual stream. Its conv and delta-rule states live in
                  the model's state slot (GpuModel arena; forked copies for system1).
  GatedAttention  full attention whose query projection also yields a per-head output gate:
                  out = Wo (attention * sigmoid(gate))
  SharedMoe       the routed experts plus the shared expert scaled by sigmoid(h . gate_inp_shexp)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...modelfile import tensor_names as T
from ...gpu.blocks import Attention, AttnWeights, Batch, FfnWeights, GatedFFN, Input, TensorReader
from ...gpu import products
from ...gpu.moe import MoeFFN, MoeWeights, SharedSlot
from ...gpu.ops import delta_net, gated
from ...gpu.ops.common import Weight
from ...gpu.ops.delta_net import MAX_CONV, MAX_HEAD
# Sequences of at most this many tokens run the delta rule token by token (one launch, the norm
# fused); longer ones the chunked kernel (32 tokens per step) and a separate norm.
RECURRENT_MAX_TOKENS = 8


def rows_of(w: Weight, first: int, count: int) -> Weight:
    """Rows [first, first + count) of a matrix (a fused tensor's part)."""
    return Weight(w.ptr + first * w.row_bytes, w.type_name, count, w.k, w.row_bytes)


def by_type(pairs):
    """(Weight, out) pairs in order, grouped into runs of <= 3 with one type and row length: the
    products one matrix-vector launch can do together."""
    groups: list[list] = []
    for w, y in pairs:
        g = groups[-1] if groups else None
        if g and len(g) < 3 and (g[0][0].type_name, g[0][0].k) == (w.type_name, w.k):
            g.append((w, y))
        else:
            groups.append([(w, y)])
    return groups


def delta_net_unsupported(c) -> str | None:
    e = c.extra
    if max(e["head_k_dim"], e["head_v_dim"]) > MAX_HEAD:
        return f"linear-attention heads of {e['head_k_dim']}/{e['head_v_dim']} exceed the kernels' {MAX_HEAD}"
    if not 1 <= e["conv_kernel"] <= MAX_CONV:
        return f"a linear-attention conv of {e['conv_kernel']} taps is outside the kernels' 1..{MAX_CONV}"
    return None


@dataclass
class DeltaNetWeights:
    qkv: Weight  # attn_qkv: [q heads | k heads | v heads] channels
    z: Weight  # attn_gate: the output gate
    alpha: Weight  # ssm_alpha, ssm_beta: per value head decay and write strength
    beta: Weight
    out: Weight  # ssm_out
    conv: int  # ssm_conv1d (C, K) float32
    a: int  # ssm_a = -exp(A_log)
    dt_bias: int
    norm: int  # ssm_norm (head_v_dim)

    @classmethod
    def read(cls, r: TensorReader, il: int) -> "DeltaNetWeights":
        m, v = (lambda n: r.matrix(T.blk(il, n))), (lambda n: r.vector(T.blk(il, n)))
        return cls(m(T.ATTN_QKV), m(T.ATTN_GATE), m(T.SSM_ALPHA), m(T.SSM_BETA), m(T.SSM_OUT), v(T.SSM_CONV1D),
                   v(T.SSM_A), v(T.SSM_DT_BIAS), v(T.SSM_NORM))


class DeltaNet:
    """out += ssm_out(gated_norm(delta_rule(conv(x W_qkv)), x W_z)) for one layer."""

    def __init__(self, model, il: int, conv_off: int, ssm_off: int):
        e, c = model.cfg.extra, model.cfg
        self.il, self.eps = il, c.rms_eps
        self.nk, self.nv, self.dk, self.dv, self.k = e["n_k_heads"], e["n_v_heads"], e["head_k_dim"], e["head_v_dim"], \
            e["conv_kernel"]
        self.channels = 2 * self.nk * self.dk + self.nv * self.dv
        self.conv_off, self.ssm_off = conv_off, ssm_off  # bytes into the model's state slot
        model.need(self.buffers(c, model.max_batch))
        self.w: DeltaNetWeights | None = None

    @staticmethod
    def state_bytes(c) -> tuple[int, int]:
        """(conv state, delta-rule state) bytes of one layer and sequence."""
        e = c.extra
        channels = 2 * e["n_k_heads"] * e["head_k_dim"] + e["n_v_heads"] * e["head_v_dim"]
        return 4 * (e["conv_kernel"] - 1) * channels, 4 * e["n_v_heads"] * e["head_k_dim"] * e["head_v_dim"]

    @staticmethod
    def buffers(c, t: int) -> list[tuple[str, int]]:
        e = c.extra
        channels = 2 * e["n_k_heads"] * e["head_k_dim"] + e["n_v_heads"] * e["head_v_dim"]
        vd = e["n_v_heads"] * e["head_v_dim"]
        return [("dn_qkv", t * channels), ("dn_conv", t * channels), ("dn_z", t * vd), ("dn_alpha", t * e["n_v_heads"]),
                ("dn_beta", t * e["n_v_heads"]), ("dn_o", t * vd),
                ("dn_prep", delta_net.prep_floats(t, t, e["n_v_heads"]))]

    def bind(self, model, il: int) -> None:
        self.w, self.p, self.launch = DeltaNetWeights.read(model.tensors, il), model.p, model.launch
        self.state_of = model.state_of

    def __call__(self, b: Batch, inp: Input, out: int, accumulate: bool = True) -> None:
        L, p, w = self.launch, self.p, self.w
        nk, nv, dk, dv = self.nk, self.nv, self.dk, self.dv
        qkv, conv, z, alpha, beta, o = p("dn_qkv"), p("dn_conv"), p("dn_z"), p("dn_alpha"), p("dn_beta"), p("dn_o")
        self._project(b, inp, qkv, z, alpha, beta)
        base, slot_bytes, slots = self.state_of(b)
        conv_state, ssm_state, stride = base + self.conv_off, base + self.ssm_off, slot_bytes // 4
        roll = b.n == b.n_seq  # every sequence is one token: the conv kernel rolls the state itself
        with L.role("linear-attn conv + l2norm"):
            delta_net.conv(L, qkv, w.conv, conv_state, stride, slots, b.seq_start, b.n_seq, b.pos, conv, b.n, self.k,
                           nk, nv, dk, dv, 1.0 / math.sqrt(dk), self.eps, roll)
            if not roll:
                delta_net.conv_state(L, qkv, conv_state, stride, slots, b.seq_start, b.n_seq, b.pos, b.n,
                                     self.channels, self.k)
        with L.role("delta rule"):
            if b.seq_max <= RECURRENT_MAX_TOKENS:
                delta_net.recurrent(L, conv, alpha, beta, z, w.a, w.dt_bias, w.norm, ssm_state, stride, slots,
                                    b.seq_start, b.n_seq, b.pos, o, b.n, nk, nv, dk, dv, self.eps)
            else:
                delta_net.chunked(L, conv, alpha, beta, w.a, w.dt_bias, ssm_state, stride, slots, b.seq_start, b.n_seq,
                                  b.pos, o, b.n, nk, nv, dk, dv, p("dn_prep"))
                delta_net.gated_norm(L, o, z, w.norm, o, b.n * nv, dv, self.eps)
        with L.role("linear-attn output", w.out.nbytes):
            products.matmul(L, w.out, o, out, b.n, accumulate=accumulate)

    def _project(self, b: Batch, inp: Input, qkv: int, z: int, alpha: int, beta: int) -> None:
        """qkv, z, alpha, beta from the input: matrix-vector launches of up to three matrices
        each for small batches; for prompts qkv and z on tensor cores, the gates (a few rows,
        whose errors compound through the decay) in float32 on the matrix-vector kernel."""
        L, w = self.launch, self.w
        pairs = [(w.qkv, qkv), (w.z, z), (w.alpha, alpha), (w.beta, beta)]
        with L.role("linear-attn in proj", sum(x.nbytes for x, _ in pairs)):
            if not b.matvec:
                products.matmul_many(L, [w.qkv, w.z], inp.ptr, [qkv, z], b.n)  # one launch when one type
                pairs = pairs[2:]
            for group in by_type(pairs):
                products.segments(L, [x for x, _ in group], inp.ptr, [y for _, y in group], b.n, norm_w=inp.norm_w,
                                  eps=self.eps)


class GatedAttention(Attention):
    """Attention whose query projection gives per head [query | gate]: out (+)= Wo (attention * sigmoid(gate))."""

    @staticmethod
    def buffers(c, t: int, rows: int = 1) -> list[tuple[str, int]]:
        return Attention.buffers(c, t, rows) + [("qg", t * 2 * c.n_head * c.head_dim), ("attn_gate", t * c.n_head * c.head_dim)]

    def read(self, r: TensorReader, il: int) -> AttnWeights:
        """attn_q ([query | gate] per head), attn_k, attn_v; or their rows of one attn_qkv (--fuse-qkv)."""
        if r.has(T.blk(il, T.ATTN_Q)):
            return AttnWeights.read(r, il)
        c = self.cfg
        fused = r.matrix(T.blk(il, T.ATTN_QKV))
        nq, nk, nv = 2 * c.n_head * c.head_dim, c.n_head_kv * c.head_dim, c.n_head_kv * c.head_dim_v
        return AttnWeights(rows_of(fused, 0, nq), rows_of(fused, nq, nk), rows_of(fused, nq + nk, nv),
                           r.matrix(T.blk(il, T.ATTN_OUT)), r.vector(T.blk(il, T.ATTN_Q_NORM)),
                           r.vector(T.blk(il, T.ATTN_K_NORM)))

    def __call__(self, b: Batch, inp: Input, out: int, accumulate: bool) -> None:
        c, L, p, w = self.cfg, self.launch, self.p, self.w
        q, k, v, att, qg, gate = p("q"), p("k"), p("v"), p("att"), p("qg"), p("attn_gate")
        self.project_qkv(b, inp, qg, k, v)
        with L.role("attn gate split"):
            gated.gate_split(L, qg, q, gate, b.n * c.n_head * c.head_dim, c.head_dim)
        self.attend(b, q, k, v, att)
        with L.role("attn output gate"):
            gated.sigmoid_mul(L, att, gate, b.n * c.n_head * c.head_dim_v)
        with L.role("attn output", w.o.nbytes):
            products.matmul(L, w.o, att, out, b.n, accumulate=accumulate)


def moe_weights(r: TensorReader, il: int, n_expert: int) -> MoeWeights:
    """The routed experts; a fused ffn_gate_up_exps (--fuse-gate-up-exps: per expert [gate | up]
    rows) is read as gate and up views of it with an expert stride of both."""
    fused = T.blk(il, T.FFN_GATE_UP_EXPS)
    if not r.has(fused):
        return MoeWeights.read(r, il)
    gu = r.matrix(fused)
    f = gu.rows // (2 * n_expert)
    up = Weight(gu.ptr + f * gu.row_bytes, gu.type_name, gu.rows, gu.k, gu.row_bytes)
    return MoeWeights(r.matrix(T.blk(il, T.FFN_ROUTER)), gu, up, r.matrix(T.blk(il, T.FFN_DOWN_EXPS)))


class SharedMoe:
    """x += routed experts(h) + sigmoid(h . w_gate) * shared_expert(h), h = norm(x). Its gate is one
    more product of the router's launch; at decode the shared expert is one more slot of the routed
    experts' gate/up and down launches when it has their type and size (gpu/moe.py SharedSlot)."""

    def __init__(self, model, il: int):
        self.moe = MoeFFN(model, il=il)
        self.eps = model.cfg.rms_eps
        model.need(GatedFFN.buffers(model.max_batch, model.cfg.extra["n_ff_shexp"]) + [("sh_logit", model.max_batch)])
        self.shared: FfnWeights | None = None
        self.gate: Weight | None = None

    def bind(self, model, il: int) -> None:
        r = model.tensors
        self.p, self.launch = model.p, model.launch
        self.moe.bind(model, il, moe_weights(r, il, self.moe.n_expert))
        if r.has(T.blk(il, T.FFN_UP_SHEXP)):
            self.shared = FfnWeights.read(r, il, FfnWeights.SHARED_EXPERT)
            self.gate = r.matrix(T.blk(il, T.FFN_ROUTER_SHEXP))

    def unread_bytes(self) -> int:
        return self.moe.unread_bytes()

    def __call__(self, b: Batch, inp: Input, out: int, accumulate: bool = True) -> None:
        L, p, sh = self.launch, self.p, self.shared
        if sh is None:
            self.moe(b, inp, out)
            return
        gate = [(self.gate, p("sh_logit"))]
        if b.n == 1:  # one more slot of the routed experts' launches where it has their shape
            slot = SharedSlot(sh, p("sh_logit"), lambda act: self._gate_up(b, inp, act),
                              lambda act: self._down(b, act, out))
            self.moe(b, inp, out, also=gate, shared=slot)
            return
        # the shared expert reads its input before the routed experts add into the residual
        # stream (for small batches the input *is* the stream, normalized on the fly)
        self._gate_up(b, inp, p("act"))
        self.moe(b, inp, out, also=gate)
        self._down(b, p("act"), out)

    def _gate_up(self, b: Batch, inp: Input, act: int) -> None:
        L, p, sh = self.launch, self.p, self.shared
        with L.role("shared expert gate/up + act", sh.gate.nbytes + sh.up.nbytes):
            products.gated_ffn_in(L, sh.gate, sh.up, inp.ptr, act, b.n, GatedFFN.SILU, p("g"), p("u"),
                                  norm_w=inp.norm_w, eps=self.eps)

    def _down(self, b: Batch, act: int, out: int) -> None:
        L, p, sh = self.launch, self.p, self.shared
        n_ff = sh.gate.rows
        with L.role("shared expert down (+residual)", sh.down.nbytes):
            gated.sigmoid_mul(L, act, p("sh_logit"), b.n * n_ff, n_ff)
            products.matmul(L, sh.down, act, out, b.n, accumulate=True)