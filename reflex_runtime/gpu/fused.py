"""The fused decode step: a dense model's whole one-token step (embedding, every layer, the LM
head and the greedy pick) as one persistent kernel (kernels/fused_step.cu) that runs a program of
ops built here from the model's blocks, in the order GpuModel.forward launches them: the same
arithmetic as the staged kernels (mvs.cu's row dots, attn_decode.cu's attention with the rope
fused, norm.cu's post-norms), one grid-wide barrier between ops instead of ~5 kernel boundaries a
layer. The runner's single-sequence decode graph launches it where `build` says it can; anything
it does not cover (MoE, recurrent and latent-attention mixers, soft-capped heads, mixed gate/up
types, weights or shapes outside the staged kernels) keeps the kernel-per-op graph.
Off by default until it beats the kernel-per-op graph (issue 27); REFLEX_FUSED_STEP=1 turns it
on, and reflex bench measures both.
"""

from __future__ import annotations

import ctypes

from ..modelfile.ggml_types import GGML_TYPES_BY_NAME
from .blocks import Attention, GatedFFN, Input
from .ops import attn_decode
from .ops import fused_step as fs
from .ops.common import WEIGHT_TYPES, Weight

RED_FLOATS = 2048  # partial row sums a tile may leave (rows x warps per row x runs)
POST_MAX = 8 * fs.THREADS  # a folded post-norm's width (kernels/fused_step.cu FS_POST_E a thread)


def _folds(model) -> bool:
    """Whether Gemma's post-norms are folded into the matrix op after each (Launcher.fused_fold_norms,
    up to POST_MAX wide): the builder and the op count both ask."""
    return model.launch.fused_fold_norms and model.cfg.n_embd <= POST_MAX


class Unfusable(Exception):
    """Why a model's step runs as separate kernels."""


def _type(w: Weight) -> int:
    if w.type_name not in WEIGHT_TYPES:
        raise Unfusable(f"{w.type_name} weights")
    return GGML_TYPES_BY_NAME[w.type_name].type_id


class _Builder:
    """The op list of one step, with what the launch needs to hold (the largest tile sums)."""

    def __init__(self, model, grid: int, buf_bytes: int):
        self.m, self.p, self.grid, self.buf = model, model.p, grid, buf_bytes
        self.ops: list[fs.FsOp] = []
        self.roles: list[str] = []  # what each op does (FusedStep.profile's rows)
        self.attn_bytes = 0
        # Gemma's post-norms folded into the matrix op after each (Launcher.fused_fold_norms): every
        # block of that op makes its input from the residual and the post-norm's source, so the
        # norm's op (one block working, the rest at its barrier) goes; the residual then alternates
        # between x and h (h is no op's input any more)
        self.fold = _folds(model)
        self._post = None  # a folded post-norm waiting for its matrix op: (src, w_src, w_out or 0)
        self._resid = (self.p("x"), self.p("h"))  # (where the residual is, the other buffer)

    def _add(self, op: fs.FsOp, role: str) -> fs.FsOp:
        self.ops.append(op)
        self.roles.append(role)
        return op

    def _mv(self, kind: int, ws: list[Weight], ys: list[int], inp: Input, role: str, accumulate: bool = False,
            act: int = 0) -> fs.FsOp:
        k = ws[0].k
        if any(w.k != k for w in ws) or any(w.ptr % 16 for w in ws) or inp.ptr % 16:
            raise Unfusable("matrices that do not share an aligned input")
        wpr = fs.wpr_of(k)
        if wpr is None:
            raise Unfusable(f"rows of {k} weights")
        ranges = 2 if kind == fs.GLU else 1
        rb = min(fs.tile_rows(sum(w.rows for w in ws) if kind != fs.GLU else ws[0].rows,
                              max(w.row_bytes for w in ws), ranges, self.buf, self.grid),
                 RED_FLOATS // (ranges * wpr))
        if rb < 1:
            raise Unfusable(f"rows of {max(w.row_bytes for w in ws)} bytes do not fit a tile buffer")
        op = fs.FsOp(kind=kind)
        m = op.u.mv
        for i, w in enumerate(ws):  # FS_GLU: gate and up, one output
            m.w[i], m.row_bytes[i], m.rows[i], m.type[i] = w.ptr, w.row_bytes, w.rows, _type(w)
            m.y[i] = ys[i] if i < len(ys) else None
        m.n_w, m.K, m.rb, m.wpr, m.accumulate, m.act = len(ws), k, rb, wpr, int(accumulate), act
        m.x, m.norm_w, m.eps = inp.ptr, inp.norm_w or None, self.m.cfg.rms_eps
        if self._post:  # this op's input is the folded norm's output (h), or the residual it leaves (x)
            src, w_src, w_out = self._post
            r_in, r_out = self._resid
            assert inp.ptr in self._resid and k == self.m.cfg.n_embd, "a folded post-norm feeds the next matrix op"
            m.post_src, m.post_w_src, m.post_resid, m.post_resid_out = src, w_src or None, r_in, r_out
            m.x, m.norm_w = r_in, (w_out or inp.norm_w) or None
            self._post, self._resid = None, (r_out, r_in)
        return self._add(op, role)

    def embed(self) -> None:
        m, e = self.m, self.m.embedding
        op = fs.FsOp(kind=fs.EMBED)
        f = op.u.embed
        f.table, f.row_bytes, f.tokens, f.out = e.ptr, e.row_bytes, self.p("tokens"), self.p("x")
        f.n_embd, f.n_vocab, f.type, f.scale = m.cfg.n_embd, e.rows, _type(e), m.embed_scale
        self._add(op, "embedding")

    def attention(self, a: Attention, inp: Input, out: int, accumulate: bool) -> None:
        c, w, p, L = a.cfg, a.w, self.p, self.m.launch
        if not attn_decode.fits(L, c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v) or c.rope_dim > c.head_dim \
                or c.rope_dim % 2:
            raise Unfusable("attention heads the decode kernel does not serve")
        self._mv(fs.MV, [w.q, w.k, w.v], [p("q"), p("k"), p("v")], inp, "qkv")
        op = fs.FsOp(kind=fs.ATTN)
        f = op.u.attn.a
        f.q, f.k_cache, f.v_cache, f.kv_pos = p("q"), a.k_cache, a.v_cache, p("kv_pos")
        f.q_pos, f.q_slot, f.seq_lo, f.n_kv_ptr = p("pos"), p("slot"), None, p("n_kv")
        f.out, f.part_o, f.part_ml, f.counters = p("att"), p("part_o"), p("part_ml"), p("attn_counters")
        f.n_head, f.n_head_kv, f.hd, f.hd_v, f.n_rows = c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v, a.n_rows
        f.window, f.scale, f.softcap = a.window, a.scale, 0.0
        # prefetch: what the attention may read before its wait (FS_ATTN_EARLY: before the barrier)
        f.min_keys, f.prefetch, f.window_slots = max(1, L.attn_min_keys), int(L.fused_attn_early), 1
        r = f.rope
        r.k, r.v, r.q_norm, r.k_norm, r.factors = p("k"), p("v"), w.q_norm or None, w.k_norm or None, \
            a.rope_factors or None
        r.eps, r.base, r.freq_scale, r.rope_dim, r.mode = a.eps, a.rope_base, a.rope_freq_scale, c.rope_dim, \
            1 if a.rope_pairs else 0
        r.theta = a.rope_theta
        f.kv_blocks = self.m.kv_table(0) or None
        op.u.attn.max_split = max(1, min(attn_decode.SPLITS_MAX, self.grid // c.n_head_kv))
        # blocks sharing a KV head's query heads at short contexts, as the graph's attention does
        # (Gemma 3 270M: its one KV head on 4 blocks, not 1: 940 -> 1,007 tok/s, s29)
        op.u.attn.n_hg = attn_decode.head_groups(L, c.n_head // c.n_head_kv) if L.fused_attn_groups else 1
        self._add(op, "attention + qk-norm + rope + cache store")
        self.attn_bytes = max(self.attn_bytes, fs.attn_bytes(c.n_head // c.n_head_kv, c.head_dim, c.head_dim_v))
        self._mv(fs.MV, [w.o], [out], Input(p("att")), "attn output", accumulate)

    def ffn(self, f: GatedFFN, inp: Input, out: int, accumulate: bool) -> None:
        w = f.w
        if w.gate.type_name != w.up.type_name or w.gate.row_bytes != w.up.row_bytes:
            raise Unfusable("gate and up of different types")
        self._mv(fs.GLU, [w.gate, w.up], [self.p("act")], inp, "ffn gate/up + act", act=f.act)
        self._mv(fs.MV, [w.down], [out], Input(self.p("act")), "ffn down", accumulate)

    def norm(self, src: int, w_src: int, w_out: int, out: int) -> None:
        if self.fold:
            self._post = (src, w_src, w_out if out else 0)
            return
        op = fs.FsOp(kind=fs.NORM)
        f = op.u.norm
        f.src, f.w_src, f.resid, f.w_out, f.out = src, w_src or None, self.p("x"), w_out or None, out or None
        f.n, f.eps = self.m.cfg.n_embd, self.m.cfg.rms_eps
        self._add(op, "post-norm + residual")

    def head(self, state, greedy: bool) -> None:
        m, p = self.m, self.p
        h = m.head
        if h.softcap > 0:
            raise Unfusable("a soft-capped LM head")
        op = self._mv(fs.HEAD, [h.w], [p("logits")], self._head_input, "lm head + argmax" if greedy else "lm head")
        if greedy:
            pk = op.u.mv.pick
            pk.part_v, pk.part_i, pk.counter, pk.last = p("amax_v"), p("amax_i"), p("mvs_counters"), 0
            for i, name in enumerate(("tokens", "pos", "slot", "n_kv", "step", "out_tokens")):
                pk.st[i] = getattr(state, name)

    def layers(self) -> None:
        """The layers as DecoderLayer / Residual run them for one token (gpu/layer.py)."""
        m, p = self.m, self.p
        x, h, o = p("x"), p("h"), p("o")
        h_holds = 0  # the norm weight h holds x normalized with (0: none)
        for il, ly in enumerate(m.layers):
            if type(ly.mixer) is not Attention or type(ly.ffn) is not GatedFFN:
                raise Unfusable(f"layer {il}'s {type(ly.mixer).__name__} / {type(ly.ffn).__name__}")
            nxt = m.layers[il + 1].attn_norm if il + 1 < len(m.layers) else 0
            if ly.post_names:
                inp = Input(h) if h_holds == ly.attn_norm else Input(x, ly.attn_norm)
                self.attention(ly.mixer, inp, o, False)
                self.norm(o, ly.post_attn_norm, ly.ffn_norm, h)
                self.ffn(ly.ffn, Input(h), o, False)
                self.norm(o, ly.post_ffn_norm, nxt, h if nxt else 0)
                h_holds = nxt
            else:
                self.attention(ly.mixer, Input(x, ly.attn_norm), x, True)
                self.ffn(ly.ffn, Input(x, ly.ffn_norm), x, True)
                h_holds = 0
        self._head_input = Input(h) if h_holds and h_holds == m.head.norm_w else Input(x, m.head.norm_w)


class FusedStep:
    """The uploaded programs (greedy: the pick fused into the head; sampled: logits only) and
    their launch shape. `build` returns one, or raises Unfusable."""

    def __init__(self, model, layout: fs.Layout, grid: int, programs: dict[bool, tuple[int, int]], flags: int = 0):
        self.model, self.layout, self.grid, self.programs, self.flags = model, layout, grid, programs, flags

    @classmethod
    def build(cls, model, state) -> "FusedStep":
        L, dev = model.launch, model.launch.dev
        if not L.fused_step:
            raise Unfusable("off (REFLEX_FUSED_STEP=1 turns it on)")
        if not (L.staged and L.attn_decode and L.fuse_rope):
            raise Unfusable("the staged decode kernels are off")
        if not getattr(dev, "cooperative", False):
            raise Unfusable("no cooperative launches on this GPU")
        # the tile buffers depend on the attention's memory: size them for the largest first
        groups = {(ly.mixer.cfg.n_head // ly.mixer.cfg.n_head_kv, ly.mixer.cfg.head_dim, ly.mixer.cfg.head_dim_v)
                  for ly in model.layers if isinstance(ly.mixer, Attention)}
        attn = max((fs.attn_bytes(*g) for g in groups), default=0)
        fold = _folds(model)
        n_ops = 2 + sum(7 if ly.post_names and not fold else 5 for ly in model.layers)
        lay = fs.layout(dev.max_shared, attn, RED_FLOATS, n_ops)
        if lay is None:
            raise Unfusable("no room for the tile buffers")
        grid = dev.sm_count
        if grid > model.arena.sizes["amax_v"] // 4:  # the fused pick's per-block partials
            raise Unfusable(f"{grid} blocks' pick partials do not fit")
        flags = (fs.LOOKAHEAD if L.fused_lookahead else 0) | (fs.ATTN_EARLY if L.fused_attn_early else 0)
        folds = fold and any(ly.post_names for ly in model.layers)
        if L.fused_x_early or folds:  # room for x (and norm weights): the ops' K, from a first build
            b = _Builder(model, grid, lay.buf_bytes)
            b.embed()
            b.layers()
            b.head(state, True)
            mats = [op.u.mv for op in b.ops if op.kind in (fs.MV, fs.GLU, fs.HEAD)]
            x_floats = max(m.K for m in mats if L.fused_x_early or m.post_src)
            staged_nw = [m.K for m in mats if m.norm_w and not m.post_src]  # (a fold reads its weights itself)
            nw_floats = max(staged_nw, default=0) if L.fused_x_early else 0
            lay = fs.layout(dev.max_shared, attn, RED_FLOATS, n_ops, x_floats, nw_floats)
            if lay is None:
                raise Unfusable("no room for the tile buffers beside x")
            flags |= fs.X_EARLY if L.fused_x_early else 0
        per_sm = dev.kernel("reflex_fused_step").blocks_per_sm(fs.THREADS, lay.smem)
        if per_sm < 1:
            raise Unfusable("one block per SM does not fit")
        programs, keep, ops = {}, [], {}
        base = model.p("fused_ops")
        for i, greedy in enumerate((True, False)):
            b = _Builder(model, grid, lay.buf_bytes)
            b.embed()
            b.layers()
            b.head(state, greedy)
            n = len(b.ops)
            assert n == n_ops <= model.fused_max_ops, (n, n_ops)
            arr = (fs.FsOp * n)(*b.ops)
            ptr = base + i * model.fused_program_bytes
            dev.htod(ptr, ctypes.addressof(arr), ctypes.sizeof(arr), L.stream)  # before the step's launches
            keep.append(arr)  # until the asynchronous copy has read it
            programs[greedy] = (ptr, n)
            ops[greedy] = list(zip(b.ops, b.roles))
        step = cls(model, lay, grid, programs, flags)
        step._host, step._ops = keep, ops
        return step

    def launch(self, greedy: bool, stamps: int = 0) -> None:
        """Enqueue one step: the state advanced when greedy, else the logits for the sampler."""
        ptr, n = self.programs[greedy]
        fs.launch(self.model.launch, ptr, n, self.model.p("fused_counters"), self.layout, self.grid, stamps,
                  self.flags)

    def profile(self, fetch, repeats: int = 20) -> list[dict]:
        """Where a step's time goes (reflex bench), per role summed over its ops: from block 0's
        start of the op to the last block's start (the barrier's release, as blocks see it), to the
        last block with its input and first tile in (matrix ops), to the last block's end of its
        work; then the barrier to the next op's start; and the weight bytes read (GB/s over the
        work). Medians of `repeats` steps of the sampled program (the state is not advanced; the
        cache slot of the current position is rewritten). fetch(ptr, count) -> u64 array."""
        import numpy as np

        L, dev = self.model.launch, self.model.launch.dev
        _, n = self.programs[False]
        ops = self._ops[False]
        stamps = dev.alloc(8 * 4 * n)
        try:
            runs = []
            for _ in range(repeats + 1):
                dev.memset32(stamps, 0, 8 * n, L.stream)
                self.launch(False, stamps)
                runs.append(fetch(stamps, 4 * n).astype(np.int64).reshape(4, n))
        finally:
            dev.free(stamps)
        start, last_start, ready, end = np.median(np.stack(runs[1:]), axis=0)
        barrier = np.append(start[1:] - end[:-1], 0.0)
        rows: dict[str, dict] = {}
        for i, (op, role) in enumerate(ops):
            r = rows.setdefault(role, {"role": role, "ops": 0, "us_release": 0.0, "us_ready": 0.0, "us_work": 0.0,
                                       "us_barrier": 0.0, "weight_bytes": 0})
            r["ops"] += 1
            r["us_release"] += (last_start[i] - start[i]) / 1e3
            r["us_ready"] += (ready[i] - start[i]) / 1e3 if ready[i] else 0.0
            r["us_work"] += (end[i] - start[i]) / 1e3
            r["us_barrier"] += barrier[i] / 1e3
            if op.kind in (fs.MV, fs.GLU, fs.HEAD):
                m = op.u.mv
                r["weight_bytes"] += sum(m.rows[k] * m.row_bytes[k] for k in range(m.n_w))
        for r in rows.values():
            for k in ("us_release", "us_ready", "us_work", "us_barrier"):
                r[k] = round(r[k], 1)
            r["gb_s"] = round(r["weight_bytes"] / (r["us_work"] * 1e3), 1) if r["weight_bytes"] and r["us_work"] else None
        total = {"role": "whole step", "ops": n, "us_work": round((end[-1] - start[0]) / 1e3, 1)}
        return [total] + list(rows.values())
