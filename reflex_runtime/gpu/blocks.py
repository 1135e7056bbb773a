"""The GPU blocks families build their forward from: the residual stream and its norms, attention
over the KV cache, the gated FFN, the LM head. Each block holds its weights (as they sit in the
arena), says which activation buffers it needs, and picks its kernels for the batch at hand,
including whether an RMS norm folds into the matrix kernels: that choice is made here, from
`products.matvec_path`, and nowhere in a family's forward.

Weights are read in place from the GGUF data region: `TensorReader.matrix(name)` is a `Weight`
whose pointer is `arena weights + (tensor offset - data offset)`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..modelfile import tensor_names as T
from ..errors import UnsupportedModelError
from ..modelfile.ggml_types import GGML_TYPES
from . import products
from .launch import Launcher
from .ops import attention, attn_decode, flash_attn, logits, mvs, norm, rope
from .ops.attn_decode import AtdRope
from .ops.common import WEIGHT_TYPES, Weight
from .products import matvec_path


class TensorReader:
    """Device views of a GGUF's tensors once its data region sits at `weights_ptr`."""

    def __init__(self, gguf, weights_ptr: int):
        self.gguf, self.base = gguf, weights_ptr

    def has(self, name: str) -> bool:
        return name in self.gguf.tensors

    def matrix(self, name: str) -> Weight:
        ti = self.gguf.tensor(name)
        t = GGML_TYPES[ti.ggml_type]
        if t.name not in WEIGHT_TYPES:
            raise UnsupportedModelError(f"tensor '{ti.name}' is {t.name}, which the CUDA kernels do not read")
        k = ti.shape[0]
        if k % 32:
            raise UnsupportedModelError(f"tensor '{ti.name}' rows of {k} are not a multiple of 32")
        return Weight(self.base + ti.offset - self.gguf.data_offset, t.name, ti.n_elements // k, k,
                      k // t.block_size * t.type_size)

    def vector(self, name: str, required: bool = True) -> int:
        """An F32 vector (norm weights, biases): its device pointer, or 0 when optional and absent."""
        ti = self.gguf.tensors.get(name)
        if ti is None:
            if required:
                raise UnsupportedModelError(f"GGUF has no tensor '{name}'")
            return 0
        if ti.type_name != "F32":
            raise UnsupportedModelError(f"tensor '{name}' is {ti.type_name}; the CUDA engine expects F32 vectors")
        return self.base + ti.offset - self.gguf.data_offset


@dataclass
class Batch:
    """One forward pass: n tokens whose ids, positions and cache slots sit in the device state
    arrays from index `first`; `tree` passes system1's segment starts to attention. Recurrent
    layers see the batch as `n_seq` independent sequences (their starts in the device array
    `seq_start`; 0: one sequence of all n tokens), each continuing its own copy of the recurrent
    state when `forked` (GpuModel.fork)."""

    n: int
    tokens: int
    pos: int
    slot: int
    seg_lo: int  # 0: plain causal attention
    prefix_len: int
    n_kv: int  # device int: visible cache slots
    n_seq: int = 1
    seq_start: int = 0  # device ints [n_seq + 1]
    seq_max: int = 0  # tokens in the longest sequence
    forked: bool = False
    # every cache slot j holds position j + c (prompts, decode, check; not system1's trees): a
    # sliding window then bounds the slots decode attention reads
    slots_in_order: bool = True
    # continuous batching (gpu/batch.py): rows = every token is its own sequence's decode token,
    # its keys from slot seg_lo[row] (the pointer `seg_lo` then means that; recurrent layers see
    # n one-token sequences, each in its own state slot); kv_base = the slots of this batch count
    # from that cache slot (one sequence's prompt chunk in its range, and its state slot)
    rows: bool = False
    kv_base: int = 0

    @property
    def matvec(self) -> bool:
        return matvec_path(self.n, rows=self.rows)


@dataclass(frozen=True)
class Input:
    """What a block's matrices read: `ptr`, RMS-normalized on the fly with `norm_w` when that is
    non-zero (matrix-vector path only); with `post` (mvs.Post, one token), ptr + norm(post.src) *
    post.w first: the previous block's post-norm, folded in (the block said it takes one)."""

    ptr: int
    norm_w: int = 0
    post: mvs.Post | None = None


class Residual:
    """The residual stream x (n x n_embd floats) and h, where a normalized copy of x is kept when
    the tensor-core path needs one. `normed(b, w)` is a block's pre-norm: folded into the matrix
    kernels for small batches, else one norm kernel into h (skipped when h already holds it).
    A post-norm may wait for the next block's matrix kernel to fold it in (add_normed(fold=True)):
    that kernel reads x and leaves x + norm(src) * w in x2, which becomes x (its other blocks still
    read the old one); begin() makes the first buffer x again for the next forward."""

    BUFFERS = ("x", "h", "o")
    ONE_ROW = ("x2",)  # n_embd floats: the other residual of a one-token forward with folded post-norms

    def __init__(self, launch: Launcher, x: int, h: int, o: int, n_embd: int, eps: float, x2: int = 0):
        self.launch, self.x, self.h, self.o, self.n_embd, self.eps = launch, x, h, o, n_embd, eps
        self.x2, self._first = x2, (x, x2)
        self.h_holds = 0  # the norm weight h was last normalized with (0: h is stale)
        self.pending: tuple[int, int] | None = None  # a post-norm (src, w) the next block folds in

    def begin(self) -> None:
        """A forward starts: x is the first buffer (a one-token step may have left it in x2)."""
        self.x, self.x2 = self._first
        self.h_holds, self.pending = 0, None

    def normed(self, b: Batch, norm_w: int, fold: bool = True) -> Input:
        """fold=False: always norm(x) in h, for blocks that read it while others add into x."""
        if self.pending is not None:  # the block said it takes the post-norm (add_normed(fold=True))
            assert fold and b.matvec
            src, w = self.pending
            inp = Input(self.x, norm_w, mvs.Post(src, w, self.x2, self.eps))
            self.x, self.x2, self.pending = self.x2, self.x, None
            return inp
        if self.h_holds == norm_w:
            return Input(self.h, 0)
        if b.matvec and fold:
            return Input(self.x, norm_w)
        norm.rmsnorm(self.launch, self.x, norm_w, self.h, b.n, self.n_embd, self.eps)
        self.h_holds = norm_w
        return Input(self.h, 0)

    def added(self) -> None:
        """x changed (a block accumulated into it): h no longer holds its norm."""
        self.h_holds = 0

    def add_normed(self, b: Batch, src: int, post_w: int, next_w: int = 0, fold: bool = False) -> None:
        """x += norm(src) * post_w (a post-norm, as Gemma's); with next_w, the same kernel also
        leaves norm(x) * next_w in h for the next block (free here, unlike folding it later).
        fold (the next block takes it, one token, a post weight): no launch here; the next block's
        matrix kernel does both (normed())."""
        if fold and next_w and post_w and self.x2 and not any(p % 16 for p in (src, post_w, next_w, self.x, self.x2)):
            self.pending, self.h_holds = (src, post_w), 0  # (the staged kernels read all of them 16 bytes at a time)
            return
        out = self.h if next_w else 0
        norm.rmsnorm(self.launch, src, next_w, out, b.n, self.n_embd, self.eps, resid=self.x, w_src=post_w)
        self.h_holds = next_w


@dataclass
class AttnWeights:
    q: Weight
    k: Weight
    v: Weight
    o: Weight
    q_norm: int  # per-head RMS norm weights (0: none)
    k_norm: int

    @classmethod
    def read(cls, r: TensorReader, il: int) -> "AttnWeights":
        return cls(r.matrix(T.blk(il, T.ATTN_Q)), r.matrix(T.blk(il, T.ATTN_K)), r.matrix(T.blk(il, T.ATTN_V)),
                   r.matrix(T.blk(il, T.ATTN_OUT)), r.vector(T.blk(il, T.ATTN_Q_NORM), False),
                   r.vector(T.blk(il, T.ATTN_K_NORM), False))


class Attention:
    """Multi-head attention of one layer: q/k/v projections, per-head q/k norms + RoPE + the f16
    cache store in one kernel, attention over the cache (split across blocks for a single decode
    token), and the output projection. Its KV cache is a piece of the arena.

    RoPE: NeoX halves by default; `rope_pairs` rotates adjacent dims (Llama); `rope_freq_scale`
    multiplies every frequency (1 / a linear scaling factor); `rope_factors` names an F32 tensor
    of rope_dim/2 per-pair divisors (Llama 3.1+'s rope_freqs), read in place."""

    def __init__(self, model, il: int, rope_base: float, window: int = 0, scale: float | None = None,
                 rope_pairs: bool = False, rope_freq_scale: float = 1.0, rope_factors: str | None = None):
        c = model.cfg
        self.cfg, self.il, self.n_rows = c, il, model.kv_rows  # cache rows per KV head (GpuModel.paged)
        self.rope_base, self.window = rope_base, window
        self.rope_pairs, self.rope_freq_scale, self._rope_factors_name = rope_pairs, rope_freq_scale, rope_factors
        self.rope_factors = 0
        self._theta_name = model.rope_table(rope_base, rope_freq_scale, c.rope_dim)  # the decode kernel's angles
        self.scale = 1.0 / math.sqrt(c.head_dim) if scale is None else scale
        self.eps = c.rms_eps
        k_bytes = c.n_head_kv * model.kv_rows * c.head_dim * 2
        v_bytes = c.n_head_kv * model.kv_rows * c.head_dim_v * 2
        model.arena.reserve(f"kv{il}", k_bytes + v_bytes)
        model.need(self.buffers(c, model.max_batch, model.max_seqs))
        self._k_bytes = k_bytes
        self.w: AttnWeights | None = None

    @staticmethod
    def unsupported(c) -> str | None:
        if c.head_dim > 256 or c.head_dim_v > 256 or c.head_dim_v % 32 or c.head_dim % 2:
            return f"head sizes {c.head_dim}/{c.head_dim_v} are outside what the attention kernel handles"
        if c.rope_dim > c.head_dim or c.rope_dim % 2:
            return f"a rotary dimension of {c.rope_dim} does not fit heads of {c.head_dim}"
        if c.n_head % c.n_head_kv:
            return f"{c.n_head} query heads do not divide into {c.n_head_kv} KV heads"
        return None

    @staticmethod
    def buffers(c, t: int, rows: int = 1) -> list[tuple[str, int]]:
        """rows: decode tokens of that many sequences in one pass (their split partials)."""
        splits = max(attention.SPLITS_DECODE, attn_decode.SPLITS_MAX)  # the legacy and the decode kernel's slices
        return [("q", t * c.n_head * c.head_dim), ("k", t * c.n_head_kv * c.head_dim),
                ("v", t * c.n_head_kv * c.head_dim_v), ("att", t * c.n_head * c.head_dim_v),
                ("part_o", rows * c.n_head * splits * c.head_dim_v), ("part_ml", rows * c.n_head * splits * 2),
                ("attn_counters", attn_decode.counters(c.n_head, rows))]  # >= the legacy kernel's rows * n_head

    def read(self, r: TensorReader, il: int) -> AttnWeights:
        """This layer's q/k/v/o weights and q/k norms (a family with another layout overrides it)."""
        return AttnWeights.read(r, il)

    def bind(self, model, il: int) -> None:
        self.w, self.p, self.launch = self.read(model.tensors, il), model.p, model.launch
        if self._rope_factors_name:
            self.rope_factors = model.tensors.vector(self._rope_factors_name)
        self.rope_theta = model.p(self._theta_name)
        self.k_cache = model.p(f"kv{self.il}")
        self.v_cache = self.k_cache + self._k_bytes
        self.kv_table = model.kv_table

    def __call__(self, b: Batch, inp: Input, out: int, accumulate: bool) -> None:
        """out (+)= Wo attention(q, k, v of the input)."""
        L, p, w = self.launch, self.p, self.w
        q, k, v, att = p("q"), p("k"), p("v"), p("att")
        self.project_qkv(b, inp, q, k, v)
        merge = self.attend(b, q, k, v, att, merge=self.out_merge(b, att))
        with L.role("attn output", w.o.nbytes):
            products.matmul(L, w.o, att, out, b.n, accumulate=accumulate, merge=merge)

    def out_merge(self, b: Batch, att: int) -> mvs.MvsMerge | None:
        """For one token: the output projection's merge of the decode attention's slices (att is its
        input as it is), where the launcher allows it (L.attn_out_merge) and both kernels serve it."""
        c, L = self.cfg, self.launch
        if not (L.attn_out_merge and b.n == 1 and not b.rows and not b.seg_lo and mvs.takes_merge(L, self.w.o, att)):
            return None
        max_split, n_hg = attn_decode.grid_splits(L, c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v)
        p = self.p
        return mvs.MvsMerge(p("part_o"), p("part_ml"), b.n_kv, b.slot, max_split, max(1, L.attn_min_keys), n_hg,
                            self.window, int(b.slots_in_order), c.head_dim_v, L.attn_out_merge)

    def attend(self, b: Batch, q: int, k: int, v: int, att: int, merge: mvs.MvsMerge | None = None) -> mvs.MvsMerge | None:
        """q/k norms, RoPE and the cache store of the new keys and values, then att = softmax(q K^T) V.
        One token: the decode kernel (K/V read once per KV head, slices by context length; in a PDL
        graph its first keys are copied before it waits, being older launches' writes), with the
        qk-norm + rope + cache store fused in where the launcher allows it; with `merge`
        (out_merge), a context of a few slices is left unmerged for the output projection. Prompts
        and system1's trees: flash attention on tensor cores (sm_80+), else the split-K scalar kernel.
        Returns `merge` when the decode kernel took it (the output projection must then merge)."""
        c, L, p, w = self.cfg, self.launch, self.p, self.w
        decode = (b.rows or (b.n == 1 and not b.seg_lo)) and attn_decode.fits(L, c.n_head, c.n_head_kv, c.head_dim,
                                                                               c.head_dim_v)
        rows = b.n if b.rows else 1
        # a prompt chunk of one sequence in its own range: its slots count from kv_base (the block
        # table's entries from that range's on; kv_pos is per logical slot)
        k_cache, v_cache, blocks = self.k_cache, self.v_cache, self.kv_table(b.kv_base)
        kv_pos = p("kv_pos") + 4 * b.kv_base
        fused = None
        if decode and L.fuse_rope:
            fused = AtdRope(k, v, w.q_norm or None, w.k_norm or None, self.rope_factors or None, self.eps,
                            self.rope_base, self.rope_freq_scale, c.rope_dim, 1 if self.rope_pairs else 0,
                            self.rope_theta)
        else:
            with L.role("qk-norm + rope + cache store"):
                rope.qk_rope_store(L, q, k, v, w.q_norm, w.k_norm, b.pos, b.slot, kv_pos, k_cache,
                                   v_cache, b.n, c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v, c.rope_dim,
                                   self.rope_base, self.rope_freq_scale, self.eps, self.n_rows,
                                   freq_factors=self.rope_factors, pairwise=self.rope_pairs, blocks=blocks)
        with L.role("attention + qk-norm + rope + cache store" if fused is not None else "attention"):
            if decode and attn_decode.attention(
                    L, q, k_cache, v_cache, kv_pos, b.pos, b.slot, b.n_kv, att, p("part_o"),
                    p("part_ml"), p("attn_counters"), c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v, self.n_rows,
                    self.window, self.scale, 0.0, prefetch=L.pdl, window_slots=b.slots_in_order, rope=fused,
                    rows=rows, seq_lo=b.seg_lo if b.rows else 0, blocks=blocks, defer=merge.defer if merge else 0):
                return merge
            assert fused is None, "the rope was left to the decode attention"
            if not b.rows and flash_attn.ok(L, b.n, c.head_dim, c.head_dim_v, c.n_head, c.n_head_kv):
                flash_attn.attention(L, q, k_cache, v_cache, kv_pos, b.pos, b.slot, b.seg_lo,
                                     b.prefix_len, b.n_kv, att, b.n, c.n_head, c.n_head_kv, c.head_dim, self.n_rows,
                                     self.window, self.scale, 0.0, blocks=blocks)
            else:  # rows: seg_lo with no prefix is each row's own range (reflex_attn starts there)
                n_split = attention.SPLITS_DECODE if b.n == 1 or b.rows else 1
                attention.attention(L, q, k_cache, v_cache, kv_pos, b.pos, b.slot, b.seg_lo,
                                    b.prefix_len, b.n_kv, att, p("part_o"), p("part_ml"), p("attn_counters"), b.n,
                                    c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v, self.n_rows, self.window,
                                    self.scale, 0.0, n_split, blocks=blocks)

    def project_qkv(self, b: Batch, inp: Input, q: int, k: int, v: int) -> None:
        """q, k, v projections: one launch when the three share a type (most files), else three."""
        ws = [self.w.q, self.w.k, self.w.v]
        with self.launch.role("qkv", sum(w.nbytes for w in ws)):
            products.matmul_many(self.launch, ws, inp.ptr, [q, k, v], b.n, norm_w=inp.norm_w, eps=self.eps,
                                 post=inp.post)

    def takes_post(self, b: Batch) -> bool:
        """Whether its q/k/v launch can fold the previous block's post-norm in (Input.post)."""
        return b.n == 1 and not b.rows and mvs.folds_post(self.launch, [self.w.q, self.w.k, self.w.v])


@dataclass
class FfnWeights:
    gate: Weight
    up: Weight
    down: Weight

    NAMES = (T.FFN_GATE, T.FFN_UP, T.FFN_DOWN)
    SHARED_EXPERT = (T.FFN_GATE_SHEXP, T.FFN_UP_SHEXP, T.FFN_DOWN_SHEXP)

    @classmethod
    def read(cls, r: TensorReader, il: int, names: tuple[str, str, str] = NAMES) -> "FfnWeights":
        return cls(*(r.matrix(T.blk(il, name)) for name in names))


class GatedFFN:
    """down(act(gate x) * up x), act SiLU (SwiGLU) or GELU-tanh (GeGLU): gate and up in one
    launch where they share a type (the activation fused), then down."""

    SILU, GELU = 0, 1

    def __init__(self, model, n_ff: int, act: int, names: tuple[str, str, str] = FfnWeights.NAMES):
        self.n_ff, self.act, self.eps, self.names = n_ff, act, model.cfg.rms_eps, names
        model.need(self.buffers(model.max_batch, n_ff))
        self.w: FfnWeights | None = None

    @staticmethod
    def unsupported(c) -> str | None:
        if c.n_embd % 32 or c.n_ff % 32:
            return "hidden sizes must be multiples of 32"
        return None

    @staticmethod
    def buffers(t: int, n_ff: int) -> list[tuple[str, int]]:
        return [("g", t * n_ff), ("u", t * n_ff), ("act", t * n_ff)]

    def bind(self, model, il: int) -> None:
        self.w, self.p, self.launch = FfnWeights.read(model.tensors, il, self.names), model.p, model.launch

    def __call__(self, b: Batch, inp: Input, out: int, accumulate: bool) -> None:
        L, p, w = self.launch, self.p, self.w
        with L.role("ffn gate/up + act", w.gate.nbytes + w.up.nbytes):
            products.gated_ffn_in(L, w.gate, w.up, inp.ptr, p("act"), b.n, self.act, p("g"), p("u"),
                                  norm_w=inp.norm_w, eps=self.eps, post=inp.post)
        with L.role("ffn down", w.down.nbytes):
            products.matmul(L, w.down, p("act"), out, b.n, accumulate=accumulate)

    def takes_post(self, b: Batch) -> bool:
        """Whether its gate/up launch can fold the previous block's post-norm in (Input.post)."""
        g, u = self.w.gate, self.w.up
        return (b.n == 1 and not b.rows and g.type_name == u.type_name and g.row_bytes == u.row_bytes
                and mvs.folds_post(self.launch, [g, u], ranges=2))


class LmHead:
    """logits = W_out norm(x) for chosen rows, the norm folded into the matrix-vector kernel for
    a few rows; optional soft-capping (Gemma)."""

    def __init__(self, model, softcap: float = 0.0):
        self.cfg, self.softcap = model.cfg, softcap

    def bind(self, model, r: TensorReader, embedding: Weight) -> None:
        c = self.cfg
        self.launch, self.p = model.launch, model.p
        self.norm_w = r.vector(T.OUTPUT_NORM)
        self.w = r.matrix(T.OUTPUT) if r.has(T.OUTPUT) else embedding
        if embedding.k != c.n_embd or self.w.rows != c.vocab_size:
            raise UnsupportedModelError("token embedding / output shapes do not match the config")

    def __call__(self, x_rows: int, n_rows: int, out: int, pick=None) -> bool:
        """out[i] = logits of row i of x_rows (n_rows rows of n_embd floats). pick = (state, last):
        the greedy choice may be fused into the head (one token, no soft-capping: tanh can turn
        distinct logits into ties); returns True when it was, and the state is advanced."""
        c, L = self.cfg, self.launch
        fuse = pick is not None and self.softcap <= 0
        with L.role("lm head + argmax" if fuse else "lm head", self.w.nbytes):
            if n_rows == 1:
                p = self.p
                head_pick = (p("amax_v"), p("amax_i"), p("mvs_counters"), pick[0], pick[1]) if fuse else None
                if mvs.head(L, self.w, x_rows, out, self.norm_w, c.rms_eps, head_pick):
                    if self.softcap > 0:
                        logits.softcap(L, out, c.vocab_size, self.softcap)
                    return fuse
            if matvec_path(n_rows, rows=L.decode_rows):
                products.matmul(L, self.w, x_rows, out, n_rows, norm_w=self.norm_w, eps=c.rms_eps)
            else:
                norm.rmsnorm(L, x_rows, self.norm_w, self.p("h"), n_rows, c.n_embd, c.rms_eps)
                products.matmul(L, self.w, self.p("h"), out, n_rows)
        if self.softcap > 0:
            logits.softcap(L, out, n_rows * c.vocab_size, self.softcap)
        return False
