"""Typed launchers for the kernels in kernels/*.cu: one method per op, argument packs in the
kernel's parameter order, and the one place that chooses between the matrix-vector and the
tensor-core paths (`matvec_path`), and between the tensor-core kernel generations (sm_80+:
gemm.cu and flash_attn.cu, mma.sync with cp.async pipelines; older GPUs: matmul.cu's WMMA tiles
and attention.cu's scalar kernel). Every method only enqueues work on the launcher's stream (so it
can be captured into a graph). `record()` keeps each launch with the role the calling block gave
it and the weight bytes it reads, which is how `reflex bench` times a decode step kind by kind.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from ctypes import Structure, c_double, c_float, c_int, c_long, c_void_p
from dataclasses import dataclass

from ..errors import UnsupportedModelError
from ..ggml_types import GGML_TYPES_BY_NAME
from .kernels import WEIGHT_TYPES

# From this many tokens a matrix product goes to the tensor-core kernel (weights read once per
# 64 tokens) instead of the matrix-vector kernel (weights read once per 4 tokens). Below it the
# matrix-vector path wins on the H200: a 16-token prefill of Qwen3-0.6B took 22 ms through the
# (WMMA) tensor-core kernel (too few tiles to fill the GPU), and 16/4 weight passes cost ~3 ms.
# scripts/bench_prefill.py measures the crossover per weight type for the sm_80+ kernels; a type
# whose matrix-vector kernel keeps winning beyond MM_MIN_TOKENS gets its own (higher) entry in
# MM_MIN_TOKENS_BY_TYPE (a batch is still normalized once for the tensor-core path from
# MM_MIN_TOKENS on; such a type then runs the matrix-vector kernel on the normalized input).
MM_MIN_TOKENS = 64
MM_MIN_TOKENS_BY_TYPE: dict[str, int] = {}
ATTN_SPLITS_DECODE = 16  # reflex_attn's slices for one token (the legacy decode attention)
# kernels/mla.cu: query heads per latent-attention block, key slices of a decode step (<= 32,
# attn_merge's limit), rope pairs in the frequency table
MLA_HEADS = 8
MLA_SPLITS_DECODE = 32
MLA_MAX_PAIRS = 64

# sm_80+ prompt kernels (mma.sync m16n8k16 with cp.async): kernels/gemm.cu, kernels/flash_attn.cu
TC_MIN_CC = (8, 0)
GEMM_CFGS = {"l": (128, 128), "s": (64, 64)}  # gemm.cu GemmL / GemmS: (tokens, weight rows) per tile
GEMM_THREADS = {"l": 256, "s": 128}
MOE_TILE = 64  # pairs per grouped expert tile and output columns per tile (gemm.cu GemmMoe = GemmS)
FLASH_HEAD_DIMS = (64, 128, 256)  # flash_attn.cu instantiations (head_dim == head_dim_v)
FLASH_ROWS = 64  # query rows (token, head) per flash-attention block
FLASH_MIN_TOKENS = 2  # one token (decode) keeps the split-K scalar kernel
_STATIC_SHARED = 1024  # headroom for the kernels' static shared memory (< 300 bytes today)
ATTN_SPLITS_MAX = 64  # reflex_attn_decode's most slices per KV head (kernels/attn_decode.cu)
ATTN_DECODE_MAX_GROUP = 16  # query heads per KV head it serves
MVS_NX = 4  # kernels/mvs.cu: a warp part covers 32 * 4 groups of 8 weights = 1024 weights of a row
STATIC_SMEM_RESERVE = 5 * 1024  # static shared memory of the staged kernels (the router's top-k: 4.5 KB)

# The decode step's kernels (one token): "staged" = kernels/mvs.cu, moe_decode.cu and
# attn_decode.cu; "legacy" = the matrix-vector and attention kernels every batch size can use.
# The launcher's attributes (staged, attn_decode, the plans' knobs) are what the bench varies.
DECODE_KERNELS = os.environ.get("REFLEX_DECODE_KERNELS", "staged")


def matvec_path(n_tok: int, type_name: str | None = None) -> bool:
    """True when a batch of n_tok tokens runs the matrix-vector kernels (which can fold an RMS
    norm of their input in); False when it runs the tensor-core kernels. Without a type: the
    batch's choice (whether its inputs get normalized by a separate kernel); with one: that
    weight type's choice for a batch whose inputs are normalized. Blocks and the launcher ask
    this; no other code compares against MM_MIN_TOKENS."""
    if n_tok < MM_MIN_TOKENS or type_name is None:
        return n_tok < MM_MIN_TOKENS
    return n_tok < MM_MIN_TOKENS_BY_TYPE.get(type_name, MM_MIN_TOKENS)


def gemm_stage_weights(type_name: str) -> int:
    """Weights of a row per pipeline stage in gemm.cu (GemmRaw<T>::KB)."""
    qk = GGML_TYPES_BY_NAME[type_name].block_size
    return 32 if type_name == "F32" else 64 if qk == 1 else 256 if qk == 256 else 128


def gemm_shared_bytes(type_name: str, cfg: str) -> int:
    """Dynamic shared memory of a gemm.cu kernel (GemmSmem<T, C>::BYTES): two stages of raw
    weight rows (each the 16-byte chunks covering the stage's bytes) and two f16 x tiles of 32 k."""
    t = GGML_TYPES_BY_NAME[type_name]
    sb = gemm_stage_weights(type_name) // t.block_size * t.type_size
    slot = (sb + 15) // 16 * 16 + 16
    bm, bn = GEMM_CFGS[cfg]
    return 2 * bn * slot + 2 * bm * 32 * 2


def flash_shared_bytes(hd: int) -> int:
    """Dynamic shared memory of reflex_flash_attn_<hd> (FaCfg<HD>::BYTES): Q, one K and one V tile."""
    bkv = 32 if hd >= 256 else 64
    return (FLASH_ROWS + 2 * bkv) * (hd + 8) * 2


@dataclass
class Launch:
    """One recorded launch: enough to replay it (its argument pack is kept alive here)."""

    kernel: object
    grid: tuple
    block: int
    args: list
    role: str
    weight_bytes: int
    shmem: int = 0


@dataclass(frozen=True)
class MvsPlan:
    """How a staged matrix-vector launch splits its rows (kernels/mvs.cu): rb rows per block,
    wpr warps per row, smem bytes of dynamic shared memory per block."""

    rb: int
    wpr: int
    smem: int


def stage_bytes(n: int) -> int:
    """kernels/stage.cuh rx_stage_bytes: shared memory that staging n bytes takes."""
    return (n + 30 + 15) & ~15


@dataclass(frozen=True)
class Weight:
    ptr: int
    type_name: str
    rows: int  # output features
    k: int  # input features (row length)
    row_bytes: int

    @property
    def suffix(self) -> str:
        return WEIGHT_TYPES[self.type_name]

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes


class MvSegs(Structure):
    """Mirror of kernels/matvec.cu's MvSegs: up to three matrices in one launch."""

    _fields_ = [("w", c_void_p * 3), ("y", c_void_p * 3), ("rows", c_int * 3)]


class MlaRope(Structure):
    """Mirror of kernels/mla.cu's MlaRope: per-pair rotation frequencies (radians per position)."""

    _fields_ = [("freq", c_double * MLA_MAX_PAIRS)]

    @classmethod
    def of(cls, freqs) -> "MlaRope":
        assert len(freqs) <= MLA_MAX_PAIRS
        tab = cls()
        for i, f in enumerate(freqs):
            tab.freq[i] = f
        return tab


class GemmSegs(Structure):
    """Mirror of kernels/gemm.cu's GemmSegs: up to three matrices, their row tiles numbered across."""

    _fields_ = [("w", c_void_p * 3), ("y", c_void_p * 3), ("rows", c_int * 3), ("tile_end", c_int * 3)]


@dataclass(frozen=True)
class MoeGroups:
    """Device arrays of reflex_moe_group's output: pairs sorted by expert and their tiles."""

    counts: int
    offsets: int
    pair_tok: int
    pair_id: int
    tile_e: int
    tile_m0: int
    n_tiles: int  # one int
    max_tiles: int  # host bound on *n_tiles: the grouped kernels' grid


def moe_max_tiles(n_pairs: int, n_expert: int) -> int:
    """Tiles of MOE_TILE pairs over all experts, at most: one partial tile per expert used."""
    return -(-n_pairs // MOE_TILE) + min(n_expert, n_pairs)


def moe_down_col_tiles(n_embd: int) -> int:
    """Column tiles of the grouped down kernel: one completion counter per (token, tile)."""
    return -(-n_embd // MOE_TILE)


class MvSegsMixed(Structure):
    """Mirror of kernels/mvs.cu's MvSegsMixed: up to three matrices of any types, one launch."""

    _fields_ = [("w", c_void_p * 3), ("y", c_void_p * 3), ("row_bytes", c_long * 3), ("rows", c_int * 3),
                ("type", c_int * 3)]


def _mvs_pick_type():
    from .driver import RxState

    class MvsPick(Structure):
        """Mirror of kernels/mvs.cu's MvsPick: the greedy pick fused into an LM head launch."""

        _fields_ = [("part_v", c_void_p), ("part_i", c_void_p), ("counter", c_void_p), ("st", RxState),
                    ("last", c_int)]

    return MvsPick


class AtdRope(Structure):
    """Mirror of kernels/attn_decode.cu's AtdRope: the rope + cache store fused into the decode
    attention (k = None: not fused)."""

    _fields_ = [("k", c_void_p), ("v", c_void_p), ("q_norm", c_void_p), ("k_norm", c_void_p), ("factors", c_void_p),
                ("eps", c_float), ("base", c_float), ("freq_scale", c_float), ("rope_dim", c_int), ("mode", c_int)]


def weight_from_tensor(ti, base: int, data_offset: int) -> Weight:
    from ..ggml_types import GGML_TYPES

    t = GGML_TYPES[ti.ggml_type]
    if t.name not in WEIGHT_TYPES:
        raise UnsupportedModelError(f"tensor '{ti.name}' is {t.name}, which the CUDA kernels do not read")
    k = ti.shape[0]
    rows = ti.n_elements // k
    if k % 32:
        raise UnsupportedModelError(f"tensor '{ti.name}' rows of {k} are not a multiple of 32")
    return Weight(base + ti.offset - data_offset, t.name, rows, k, k // t.block_size * t.type_size)


class Launcher:
    def __init__(self, device, stream):
        self.dev = device
        self.stream = stream
        self.launches = 0  # counted so tests can assert how many passes a request made
        self.pdl = False  # programmatic dependent launches (set while capturing the decode graph)
        self._k = device.kernel
        # Warps the matrix-vector kernels aim to keep in flight: 32 per SM hides the load latency.
        self._target_warps = 32 * device.sm_count
        self._recorded: list[Launch] | None = None
        self._role = ""
        self._bytes = 0
        # sm_80+ kernels (gemm.cu, flash_attn.cu); False keeps the older kernels (tests force it)
        self.tc = tuple(device.cc) >= TC_MIN_CC
        self._max_shared = device.max_shared - _STATIC_SHARED
        # Decode-step kernels and their knobs (kernels/mvs.cu, attn_decode.cu; the bench varies them).
        self.staged = self.attn_decode = DECODE_KERNELS != "legacy"
        self.mvs_blocks_per_sm = int(os.environ.get("REFLEX_MVS_BLOCKS_PER_SM", "1"))
        # Weight bytes one block stages: two blocks of consecutive kernels must fit on an SM together,
        # so the next kernel's copies can run while this one computes.
        per_sm, per_block = device.smem_per_sm, device.max_shared
        self.mvs_budget = int(os.environ.get("REFLEX_MVS_BUDGET", "0")) or max(
            8 * 1024, min(96 * 1024, per_block - STATIC_SMEM_RESERVE - 8 * 1024, per_sm // 2 - 12 * 1024))
        self.attn_min_keys = int(os.environ.get("REFLEX_ATTN_MIN_KEYS", "32"))
        self.fuse_rope = os.environ.get("REFLEX_FUSE_ROPE", "1") != "0"  # rope + cache store inside it
        self.attn_blocks_per_sm = float(os.environ.get("REFLEX_ATTN_BLOCKS_PER_SM", "2"))

    @contextmanager
    def record(self):
        """Keep every launch made inside the block (still enqueued as usual): yields the list."""
        self._recorded = out = []
        try:
            yield out
        finally:
            self._recorded = None

    @contextmanager
    def role(self, name: str, weight_bytes: int = 0):
        """Tag the launches made inside with what they do (and the weight bytes they read)."""
        prev = self._role, self._bytes
        self._role, self._bytes = name, weight_bytes
        try:
            yield
        finally:
            self._role, self._bytes = prev

    def _wpr(self, rows: int, k: int) -> int:
        """Warps per output row: split K across warps when there are too few rows to fill the GPU
        and rows are long enough that every warp keeps >= 4 steps of 256 weights (measured on the
        H200: splitting 1024-long rows costs more in reductions than it gains)."""
        wpr = 1
        while wpr < 8 and rows * wpr < self._target_warps and (wpr * 2) * 4 <= k // 256:
            wpr *= 2
        return wpr

    @staticmethod
    def _rpw(rows_per_segment: list[int], n_tok: int, wpr: int) -> int:
        """Rows per warp for one-token products: each x load then serves 2 or 4 rows."""
        if n_tok != 1 or wpr != 1:
            return 1
        total = sum(rows_per_segment)
        for r in (4, 2):
            if total >= 2048 * r and all(n % r == 0 for n in rows_per_segment):
                return r
        return 1

    def _go(self, name, grid, block, args, shmem: int = 0) -> None:
        kernel = self._k(name)
        kernel.launch(grid, block, args, self.stream, shmem=shmem, pdl=self.pdl)
        self.launches += 1
        if self._recorded is not None:
            g = grid if isinstance(grid, tuple) else (grid, 1, 1)
            self._recorded.append(Launch(kernel, g, block, args, self._role or name, self._bytes, shmem))

    # -- the staged one-token kernels (kernels/mvs.cu, moe_decode.cu) -------------------------

    def _mvs_plan(self, rows: int, row_bytes: int, k: int, ranges: int = 1, extra: int = 0) -> MvsPlan | None:
        """Rows per block for `rows` rows of `row_bytes` (each block stages `ranges` runs of rb rows
        plus `extra` bytes): about one block per SM (mvs_blocks_per_sm) while the weights fit the
        budget, else budget-sized blocks in waves (at least one row each, past the budget if the
        device has room). None when that does not fit the device."""
        wpr = 1
        while k > 8 * 32 * MVS_NX * wpr:
            wpr *= 2
        if wpr > 8 or k % 8:
            return None
        cap = max(1, (self.mvs_budget - extra) // (ranges * row_bytes))
        rb = min(-(-rows // (self.dev.sm_count * self.mvs_blocks_per_sm)), cap)
        smem = ranges * stage_bytes(rb * row_bytes) + ranges * rb * wpr * 4 + extra
        if smem > self.dev.max_shared - STATIC_SMEM_RESERVE:
            return None
        return MvsPlan(rb, wpr, smem)

    def _stageable(self, ws, *ptrs) -> bool:
        """The staged kernels read x with 16-byte loads and rows as matrix-vector.cu does."""
        return self.staged and not any(p % 16 for p in ptrs) and not any(w.ptr % 16 for w in ws)

    def _mv1(self, ws: list[Weight], x: int, ys: list[int], accumulate: bool, norm_w: int, eps: float) -> bool:
        """One token through reflex_mvs_* (weights staged before the PDL wait); matrices of
        different types (same K) go through reflex_mvs_mixed. False: not applicable."""
        w0 = ws[0]
        if not self._stageable(ws, x, norm_w) or any(w.k != w0.k for w in ws):
            return False
        plan = self._mvs_plan(sum(w.rows for w in ws), max(w.row_bytes for w in ws), w0.k)
        if plan is None:
            return False
        blocks = sum(-(-w.rows // plan.rb) for w in ws)
        if any(w.type_name != w0.type_name for w in ws):
            from ..ggml_types import GGML_TYPES_BY_NAME

            mixed = MvSegsMixed()
            for i, (w, y) in enumerate(zip(ws, ys)):
                mixed.w[i], mixed.y[i], mixed.row_bytes[i], mixed.rows[i], mixed.type[i] = (
                    w.ptr, y, w.row_bytes, w.rows, GGML_TYPES_BY_NAME[w.type_name].type_id)
            self._go("reflex_mvs_mixed", blocks, 256,
                     [mixed, c_void_p(x), c_int(w0.k), c_int(plan.rb), c_int(plan.wpr), c_int(int(accumulate)),
                      c_void_p(norm_w or None), c_float(eps)], plan.smem)
            return True
        segs = MvSegs()
        for i, (w, y) in enumerate(zip(ws, ys)):
            segs.w[i], segs.y[i], segs.rows[i] = w.ptr, y, w.rows
        self._go(f"reflex_mvs_{w0.suffix}", blocks, 256,
                 [segs, c_long(w0.row_bytes), c_void_p(x), c_int(w0.k), c_int(plan.rb), c_int(plan.wpr),
                  c_int(int(accumulate)), c_void_p(norm_w or None), c_float(eps), self._pick()], plan.smem)
        return True

    _pick_type = None

    def _pick(self, part_v: int = 0, part_i: int = 0, counter: int = 0, state=None, last: int = 0):
        """A kernels/mvs.cu MvsPick (all zero: no fused pick)."""
        if Launcher._pick_type is None:
            Launcher._pick_type = _mvs_pick_type()
        pick = Launcher._pick_type()
        if part_v:
            pick.part_v, pick.part_i, pick.counter, pick.st, pick.last = part_v, part_i, counter, state, last
        return pick

    def mv_head(self, w: Weight, x: int, y: int, norm_w: int, eps: float, pick=None) -> bool:
        """logits = W x' for one token (reflex_mvs_*). pick = (part_v, part_i, counter, state, last):
        also take the greedy argmax and advance the decode state (float part_v / int part_i arrays of
        at least w.rows entries, a zeroed int counter). False: not applicable, nothing launched."""
        if not self._stageable([w], x, norm_w):
            return False
        plan = self._mvs_plan(w.rows, w.row_bytes, w.k)
        if plan is None:
            return False
        segs = MvSegs()
        segs.w[0], segs.y[0], segs.rows[0] = w.ptr, y, w.rows
        self._go(f"reflex_mvs_{w.suffix}", -(-w.rows // plan.rb), 256,
                 [segs, c_long(w.row_bytes), c_void_p(x), c_int(w.k), c_int(plan.rb), c_int(plan.wpr), c_int(0),
                  c_void_p(norm_w or None), c_float(eps), self._pick(*pick) if pick else self._pick()], plan.smem)
        return True

    # -- elementwise and norms -------------------------------------------------------------

    def embed(self, table: Weight, tokens: int, out: int, n_tok: int, scale: float) -> None:
        self._go(f"reflex_embed_{table.suffix}", n_tok, 256,
                 [c_void_p(table.ptr), c_long(table.row_bytes), c_void_p(tokens), c_void_p(out), c_int(table.k),
                  c_int(table.rows), c_float(scale)])

    def rmsnorm(self, src: int, w_out: int, out: int, rows: int, n: int, eps: float, resid: int = 0, w_src: int = 0) -> None:
        block = 1024 if n >= 4096 else 256
        self._go("reflex_rmsnorm", rows, block,
                 [c_void_p(src), c_void_p(w_src or None), c_void_p(resid or None), c_void_p(w_out), c_void_p(out or None),
                  c_int(n), c_float(eps)])

    def glu(self, gate: int, up: int, out: int, n: int, act: int) -> None:
        self._go("reflex_glu", (n + 255) // 256, 256, [c_void_p(gate), c_void_p(up), c_void_p(out), c_long(n), c_int(act)])

    def scale(self, y: int, n: int, s: float) -> None:
        self._go("reflex_scale", (n + 255) // 256, 256, [c_void_p(y), c_long(n), c_float(s)])

    def softcap(self, y: int, n: int, cap: float) -> None:
        self._go("reflex_softcap", (n + 255) // 256, 256, [c_void_p(y), c_long(n), c_float(cap)])

    # -- matrix products -------------------------------------------------------------------

    def matmul(self, w: Weight, x: int, y: int, n_tok: int, accumulate: bool = False, x_stride: int = 0,
               norm_w: int = 0, eps: float = 0.0) -> None:
        """y[t, :] (+)= W x'[t, :] for t < n_tok, with y rows of w.rows floats. x' = x, or x RMS-normalized
        with weights norm_w (the matrix-vector path fuses it; pass norm_w only for small batches)."""
        self.matmul_many([w], x, [y], n_tok, accumulate, x_stride, norm_w, eps)

    def matmul_many(self, ws: list[Weight], x: int, ys: list[int], n_tok: int, accumulate: bool = False,
                    x_stride: int = 0, norm_w: int = 0, eps: float = 0.0) -> None:
        """ys[i] (+)= ws[i] x' for up to three matrices of one input (q, k, v): one launch when they
        share a type and row length (either path), else one each."""
        w0 = ws[0]
        x_stride = x_stride or w0.k
        if (norm_w or matvec_path(n_tok, w0.type_name)) and all(w.k == w0.k for w in ws):
            # matrix-vector path: matmul_segments splits types where its kernel needs it (not one token)
            self.matmul_segments(ws, x, ys, n_tok, accumulate, x_stride, norm_w, eps)
            return
        if not all(w.type_name == w0.type_name and w.k == w0.k for w in ws):
            for w, y in zip(ws, ys):
                self.matmul_many([w], x, [y], n_tok, accumulate, x_stride, norm_w, eps)
            return
        if all(self.gemm_ok(w) for w in ws):
            self.gemm(ws, x, ys, n_tok, accumulate, x_stride)
        elif w0.k % 64 == 0:
            for w, y in zip(ws, ys):
                self.mm_wmma(w, x, y, n_tok, accumulate, x_stride)
        else:
            self.matmul_segments(ws, x, ys, n_tok, accumulate, x_stride)

    def mm_wmma(self, w: Weight, x: int, y: int, n_tok: int, accumulate: bool = False, x_stride: int = 0) -> None:
        """matmul.cu's WMMA tiles (any GPU; the tensor-core path below sm_80). Needs K % 64 == 0."""
        assert w.k % 64 == 0
        self._go(f"reflex_mm_{w.suffix}", ((w.rows + 127) // 128, (n_tok + 63) // 64, 1), 256,
                 [c_void_p(w.ptr), c_long(w.row_bytes), c_void_p(x), c_int(x_stride or w.k), c_void_p(y), c_int(w.rows),
                  c_int(w.rows), c_int(w.k), c_int(n_tok), c_int(int(accumulate))])

    # -- sm_80+ tensor-core products (kernels/gemm.cu) ----------------------------------------

    def gemm_ok(self, w: Weight) -> bool:
        """gemm.cu reads w: an sm_80+ GPU, the tensor 16-byte aligned (GGUF aligns to 32), its
        shared-memory tiles within the device's limit."""
        return self.tc and w.ptr % 16 == 0 and gemm_shared_bytes(w.type_name, "l") <= self._max_shared

    def gemm_cfg(self, n_tok: int, rows: int) -> str:
        """128 x 128 tiles when they fill the GPU at least once, else 64 x 64 (4x the blocks): a
        512-token prompt times a 1024-row matrix is only 32 large tiles on 132 SMs."""
        bm, bn = GEMM_CFGS["l"]
        return "l" if -(-n_tok // bm) * -(-rows // bn) >= self.dev.sm_count else "s"

    def gemm(self, ws: list[Weight], x: int, ys: list[int], n_tok: int, accumulate: bool = False, x_stride: int = 0,
             cfg: str | None = None) -> None:
        """ys[i][t, :] (+)= ws[i] x[t, :] for up to three matrices of one type and row length, one launch."""
        w0 = ws[0]
        assert 1 <= len(ws) <= 3 and all(w.type_name == w0.type_name and w.row_bytes == w0.row_bytes for w in ws)
        x_stride = x_stride or w0.k
        cfg = cfg or self.gemm_cfg(n_tok, sum(w.rows for w in ws))
        bm, bn = GEMM_CFGS[cfg]
        segs, end = GemmSegs(), 0
        for i in range(3):
            if i < len(ws):
                segs.w[i], segs.y[i], segs.rows[i] = ws[i].ptr, ys[i], ws[i].rows
                end += -(-ws[i].rows // bn)
            segs.tile_end[i] = end
        self._go(f"reflex_gemm_{w0.suffix}_{cfg}", (end, -(-n_tok // bm), 1), GEMM_THREADS[cfg],
                 [segs, c_long(w0.row_bytes), c_void_p(x), c_int(x_stride), c_int(w0.k), c_int(n_tok),
                  c_int(int(accumulate))], gemm_shared_bytes(w0.type_name, cfg))

    def gemm_glu(self, wg: Weight, wu: Weight, x: int, out: int, n_tok: int, act: int, x_stride: int = 0,
                 cfg: str | None = None) -> None:
        """out[t, :] = act(Wg x[t]) * (Wu x[t]), gate and up in one pass (same type and row length)."""
        assert wg.type_name == wu.type_name and wg.row_bytes == wu.row_bytes and wg.rows == wu.rows
        cfg = cfg or self.gemm_cfg(n_tok, 2 * wg.rows)
        bm, bn = GEMM_CFGS[cfg]
        self._go(f"reflex_gemm_glu_{wg.suffix}_{cfg}", (-(-wg.rows // (bn // 2)), -(-n_tok // bm), 1), GEMM_THREADS[cfg],
                 [c_void_p(wg.ptr), c_void_p(wu.ptr), c_long(wg.row_bytes), c_void_p(x), c_int(x_stride or wg.k),
                  c_void_p(out), c_int(wg.rows), c_int(wg.k), c_int(n_tok), c_int(act)],
                 gemm_shared_bytes(wg.type_name, cfg))

    def matmul_segments(self, ws: list[Weight], x: int, ys: list[int], n_tok: int, accumulate: bool = False,
                        x_stride: int = 0, norm_w: int = 0, eps: float = 0.0) -> None:
        """Up to three matrix-vector products of the same row length in one launch (q, k, v); one
        launch per type where the types differ, except for one token (reflex_mvs_mixed)."""
        w0 = ws[0]
        assert 1 <= len(ws) <= 3 and all(w.k == w0.k for w in ws)
        if n_tok == 1 and self._mv1(ws, x, ys, accumulate, norm_w, eps):
            return
        if any(w.type_name != w0.type_name for w in ws):  # the legacy kernel reads one type: one launch each
            for w, y in zip(ws, ys):
                self.matmul_segments([w], x, [y], n_tok, accumulate, x_stride, norm_w, eps)
            return
        segs = MvSegs()
        for i, (w, y) in enumerate(zip(ws, ys)):
            segs.w[i], segs.y[i], segs.rows[i] = w.ptr, y, w.rows
        total = sum(w.rows for w in ws)
        wpr = self._wpr(total, w0.k)
        rpw = self._rpw([w.rows for w in ws], n_tok, wpr)
        per_block = 8 // wpr * rpw
        self._go(f"reflex_mv_{w0.suffix}", (total + per_block - 1) // per_block, 256,
                 [segs, c_long(w0.row_bytes), c_void_p(x), c_int(x_stride or w0.k), c_int(w0.k), c_int(n_tok),
                  c_int(int(accumulate)), c_void_p(norm_w or None), c_float(eps), c_int(wpr), c_int(rpw)])

    def gated_ffn_in(self, wg: Weight, wu: Weight, x: int, out: int, n_tok: int, act: int, g_buf: int, u_buf: int,
                     norm_w: int = 0, eps: float = 0.0) -> None:
        """out = act(Wg x') * (Wu x'); one fused pass when both weights share a type and row length
        (x' normalized on the fly when norm_w is given, matrix-vector path only; larger batches must
        pass a normalized x), else two products and the activation (g_buf, u_buf). One token goes
        through the staged kernel (weights read before the previous kernel ends) where it fits."""
        alike = wg.type_name == wu.type_name and wg.row_bytes == wu.row_bytes
        if alike and n_tok == 1 and self._stageable([wg, wu], x, norm_w):
            plan = self._mvs_plan(wg.rows, wg.row_bytes, wg.k, ranges=2)
            if plan is not None:
                self._go(f"reflex_mvs_glu_{wg.suffix}", -(-wg.rows // plan.rb), 256,
                         [c_void_p(wg.ptr), c_void_p(wu.ptr), c_long(wg.row_bytes), c_long(0), c_void_p(None),
                          c_void_p(x), c_void_p(norm_w or None), c_float(eps), c_void_p(out), c_int(wg.rows),
                          c_int(wg.k), c_int(plan.rb), c_int(plan.wpr), c_int(act)], plan.smem)
                return
        if alike and (norm_w or matvec_path(n_tok, wg.type_name)):
            self.mv_glu(wg, wu, x, out, n_tok, act, norm_w, eps)
            return
        if alike and not norm_w and self.gemm_ok(wg) and self.gemm_ok(wu):
            self.gemm_glu(wg, wu, x, out, n_tok, act)
            return
        self.matmul(wg, x, g_buf, n_tok, norm_w=norm_w, eps=eps)
        self.matmul(wu, x, u_buf, n_tok, norm_w=norm_w, eps=eps)
        self.glu(g_buf, u_buf, out, n_tok * wg.rows, act)

    def mv_glu(self, wg: Weight, wu: Weight, x: int, out: int, n_tok: int, act: int, norm_w: int = 0,
               eps: float = 0.0) -> None:
        """The matrix-vector form of gated_ffn_in (weights read once per 4 tokens)."""
        wpr = self._wpr(2 * wg.rows, wg.k)
        per_block = 8 // wpr
        self._go(f"reflex_mv_glu_{wg.suffix}", (wg.rows + per_block - 1) // per_block, 256,
                 [c_void_p(wg.ptr), c_void_p(wu.ptr), c_long(wg.row_bytes), c_void_p(x), c_int(wg.k), c_void_p(out),
                  c_int(wg.rows), c_int(wg.rows), c_int(wg.k), c_int(n_tok), c_int(act), c_void_p(norm_w or None),
                  c_float(eps), c_int(wpr)])

    # -- routed experts (kernels/moe.cu) -----------------------------------------------------

    def moe_topk(self, logits: int, n_tok: int, n_expert: int, k: int, normalize: bool, ids: int, weights: int) -> None:
        self._go("reflex_moe_topk", n_tok, 256, [c_void_p(logits), c_int(n_expert), c_int(k), c_int(int(normalize)),
                                                  c_void_p(ids), c_void_p(weights)])

    def moe_router_topk(self, w: Weight, x: int, norm_w: int, eps: float, logits: int, k: int, normalize: bool,
                        ids: int, weights: int, counter: int) -> bool:
        """One token: router logits (weights staged early) and the top-k in one launch
        (kernels/moe_decode.cu; float routers); counter: a zeroed int. False: not applicable."""
        if w.type_name not in ("F32", "F16", "BF16") or not self._stageable([w], x, norm_w):
            return False
        plan = self._mvs_plan(w.rows, w.row_bytes, w.k)
        if plan is None:
            return False
        self._go(f"reflex_moe_router_{w.suffix}", -(-w.rows // plan.rb), 256,
                 [c_void_p(w.ptr), c_long(w.row_bytes), c_void_p(x), c_void_p(norm_w or None), c_float(eps),
                  c_void_p(logits), c_int(w.rows), c_int(w.k), c_int(plan.rb), c_int(plan.wpr), c_int(k),
                  c_int(int(normalize)), c_void_p(ids), c_void_p(weights), c_void_p(counter)], plan.smem)
        return True

    def moe_glu_mv1(self, wg: Weight, wu: Weight, expert_bytes: int, ids: int, k: int, x: int, out: int, n_ff: int,
                    act: int, norm_w: int = 0, eps: float = 0.0) -> bool:
        """One token: out[s] = act(gate_e x') * (up_e x') for its k slots, the routed rows staged
        (reflex_mvs_glu_* with ids). False: not applicable."""
        if not self._stageable([wg, wu], x, norm_w, expert_bytes):
            return False
        plan = self._mvs_plan(n_ff * k, wg.row_bytes, wg.k, ranges=2)
        if plan is None:
            return False
        self._go(f"reflex_mvs_glu_{wg.suffix}", (-(-n_ff // plan.rb), k, 1), 256,
                 [c_void_p(wg.ptr), c_void_p(wu.ptr), c_long(wg.row_bytes), c_long(expert_bytes), c_void_p(ids),
                  c_void_p(x), c_void_p(norm_w or None), c_float(eps), c_void_p(out), c_int(n_ff), c_int(wg.k),
                  c_int(plan.rb), c_int(plan.wpr), c_int(act)], plan.smem)
        return True

    def moe_down_mv1(self, wd: Weight, expert_bytes: int, ids: int, weights: int, k: int, act: int, x: int,
                     n_embd: int, early: bool) -> bool:
        """One token: x += sum_s w[s] down_e act[s] (reflex_moe_mvs_down_*). early: ids and weights were
        written two or more launches back, so the routed rows are staged before the PDL wait."""
        if not self._stageable([wd], act, x, expert_bytes):
            return False
        plan = self._mvs_plan(n_embd, wd.row_bytes, wd.k, ranges=k, extra=stage_bytes(4 * k * wd.k))
        if plan is None:
            return False
        self._go(f"reflex_moe_mvs_down_{wd.suffix}", -(-n_embd // plan.rb), 256,
                 [c_void_p(wd.ptr), c_long(wd.row_bytes), c_long(expert_bytes), c_void_p(ids), c_void_p(weights),
                  c_int(k), c_void_p(act), c_void_p(x), c_int(n_embd), c_int(wd.k), c_int(plan.rb), c_int(plan.wpr),
                  c_int(int(early))], plan.smem)
        return True

    def moe_glu_mv(self, wg: Weight, wu: Weight, expert_bytes: int, ids: int, k: int, x: int, out: int, n_tok: int,
                   n_ff: int, act: int, norm_w: int = 0, eps: float = 0.0) -> None:
        """out[t*k+s] = act(gate_e x'[t]) * (up_e x'[t]) for expert e = ids[t*k+s], one launch."""
        wpr = self._wpr(n_ff * n_tok * k, wg.k)
        per_block = 8 // wpr
        self._go(f"reflex_moe_mv_glu_{wg.suffix}", ((n_ff + per_block - 1) // per_block, n_tok * k, 1), 256,
                 [c_void_p(wg.ptr), c_void_p(wu.ptr), c_long(wg.row_bytes), c_long(expert_bytes), c_void_p(ids), c_int(k),
                  c_void_p(x), c_int(wg.k), c_void_p(out), c_int(n_ff), c_int(wg.k), c_int(act), c_void_p(norm_w or None),
                  c_float(eps), c_int(wpr)])

    def moe_down_mv(self, wd: Weight, expert_bytes: int, ids: int, weights: int, k: int, act: int, x: int, n_tok: int,
                    n_embd: int) -> None:
        """x[t] += sum over t's k slots of weight * down_e act[t*k+s] (the residual add fused)."""
        wpr = self._wpr(n_embd * n_tok, wd.k)
        per_block = 8 // wpr
        self._go(f"reflex_moe_mv_down_{wd.suffix}", ((n_embd + per_block - 1) // per_block, n_tok, 1), 256,
                 [c_void_p(wd.ptr), c_long(wd.row_bytes), c_long(expert_bytes), c_void_p(ids), c_void_p(weights), c_int(k),
                  c_void_p(act), c_int(wd.k), c_void_p(x), c_int(n_embd), c_int(wpr)])

    def moe_group(self, ids: int, n_pairs: int, n_expert: int, k: int, counts: int, offsets: int, pair_tok: int,
                  pair_id: int, tile_e: int = 0, tile_m0: int = 0, n_tiles: int = 0) -> None:
        """Sort the n_pairs (token, slot) pairs by expert; with tile_e, also list the MOE_TILE-pair
        tiles the grouped sm_80+ kernels run (at most moe_max_tiles)."""
        self._go("reflex_moe_group", 1, 1024, [c_void_p(ids), c_int(n_pairs), c_int(n_expert), c_int(k), c_void_p(counts),
                                               c_void_p(offsets), c_void_p(pair_tok), c_void_p(pair_id), c_int(MOE_TILE),
                                               c_void_p(tile_e or None), c_void_p(tile_m0 or None),
                                               c_void_p(n_tiles or None)])

    def moe_mm(self, w: Weight, expert_bytes: int, n_expert: int, n_rows: int, counts: int, offsets: int, x_idx: int,
               y_idx: int, x: int, y: int) -> None:
        """y[y_idx[i]] = W_e x[x_idx[i]] for the rows i of every expert's group, on tensor cores (WMMA)."""
        self._go(f"reflex_moe_mm_{w.suffix}", ((n_rows + 127) // 128, n_expert, 1), 256,
                 [c_void_p(w.ptr), c_long(w.row_bytes), c_long(expert_bytes), c_void_p(counts), c_void_p(offsets),
                  c_void_p(x_idx), c_void_p(y_idx), c_void_p(x), c_int(w.k), c_void_p(y), c_int(n_rows), c_int(n_rows),
                  c_int(w.k)])

    def moe_gemm_glu(self, wg: Weight, wu: Weight, expert_bytes: int, n_ff: int, grp: MoeGroups, x: int, out: int,
                     act: int) -> None:
        """out[i] = act(gate_e x[tok(i)]) * (up_e x[tok(i)]) for every pair i in expert order (sm_80+)."""
        assert wg.type_name == wu.type_name and wg.row_bytes == wu.row_bytes
        self._go(f"reflex_moe_gemm_glu_{wg.suffix}", (-(-n_ff // (MOE_TILE // 2)), grp.max_tiles, 1), GEMM_THREADS["s"],
                 [c_void_p(wg.ptr), c_void_p(wu.ptr), c_long(wg.row_bytes), c_long(expert_bytes), c_void_p(grp.counts),
                  c_void_p(grp.offsets), c_void_p(grp.tile_e), c_void_p(grp.tile_m0), c_void_p(grp.n_tiles),
                  c_void_p(grp.pair_tok), c_void_p(x), c_int(wg.k), c_void_p(out), c_int(n_ff), c_int(wg.k), c_int(act)],
                 gemm_shared_bytes(wg.type_name, "s"))

    def moe_gemm_down(self, wd: Weight, expert_bytes: int, n_embd: int, grp: MoeGroups, act: int, weights: int, k: int,
                      ybuf: int, x: int, counters: int) -> None:
        """x[t] += sum over t's k slots, in slot order, of weight * down_e act[pair] (sm_80+). ybuf:
        n_pairs x n_embd floats of scratch; counters: n_tok * moe_down_col_tiles(n_embd) zeroed ints,
        left zeroed."""
        self._go(f"reflex_moe_gemm_down_{wd.suffix}", (moe_down_col_tiles(n_embd), grp.max_tiles, 1), GEMM_THREADS["s"],
                 [c_void_p(wd.ptr), c_long(wd.row_bytes), c_long(expert_bytes), c_void_p(grp.counts),
                  c_void_p(grp.offsets), c_void_p(grp.tile_e), c_void_p(grp.tile_m0), c_void_p(grp.n_tiles),
                  c_void_p(grp.pair_id), c_void_p(act), c_int(wd.k), c_void_p(weights), c_int(k), c_void_p(ybuf),
                  c_void_p(x), c_int(n_embd), c_void_p(counters)],
                 gemm_shared_bytes(wd.type_name, "s"))

    def moe_combine(self, y: int, weights: int, k: int, x: int, n_embd: int, n_tok: int) -> None:
        self._go("reflex_moe_combine", (n_tok * n_embd + 255) // 256, 256,
                 [c_void_p(y), c_void_p(weights), c_int(k), c_void_p(x), c_int(n_embd), c_int(n_tok)])

    def moe_route(self, logits: int, bias: int, n_tok: int, n_expert: int, k: int, sigmoid: bool, n_group: int,
                  n_group_used: int, group_top2: bool, normalize: bool, scale: float, ids: int, weights: int) -> None:
        """DeepSeek's routing (kernels/moe_route.cu): ids/weights (n_tok x k) from router logits."""
        self._go("reflex_moe_route", n_tok, 256,
                 [c_void_p(logits), c_void_p(bias or None), c_int(n_expert), c_int(k), c_int(int(sigmoid)),
                  c_int(n_group), c_int(n_group_used), c_int(int(group_top2)), c_int(int(normalize)), c_float(scale),
                  c_void_p(ids), c_void_p(weights)])

    # -- attention -------------------------------------------------------------------------

    def qk_rope_store(self, q, k, v, q_norm, k_norm, pos, slot, kv_pos, k_cache, v_cache, n_tok, n_head, n_head_kv,
                      hd, hd_v, rope_dim, base, freq_scale, eps, n_ctx, freq_factors: int = 0, pairwise: bool = False) -> None:
        """Per-head q/k norms (when given), RoPE and the k/v cache store. pairwise: rotate adjacent
        dims (2i, 2i+1) (llama.cpp's normal rope) instead of NeoX halves (i, i + rope_dim/2);
        freq_factors: device pointer to rope_dim/2 floats dividing each pair's frequency (0: none)."""
        self._go("reflex_qk_rope_store", (n_tok, n_head + n_head_kv, 1), 128,
                 [c_void_p(q), c_void_p(k), c_void_p(v), c_void_p(q_norm or None), c_void_p(k_norm or None), c_void_p(pos),
                  c_void_p(slot), c_void_p(kv_pos), c_void_p(k_cache), c_void_p(v_cache), c_int(n_head), c_int(n_head_kv),
                  c_int(hd), c_int(hd_v), c_int(rope_dim), c_float(base), c_float(freq_scale),
                  c_void_p(freq_factors or None), c_int(int(pairwise)), c_float(eps), c_int(n_ctx)])

    def attention(self, q, k_cache, v_cache, kv_pos, q_pos, q_slot, seg_lo, prefix_len, n_kv, out, part_o, part_ml,
                  counters, n_tok, n_head, n_head_kv, hd, hd_v, n_ctx, window, scale, softcap, n_split) -> None:
        """counters: n_tok * n_head zeroed ints (n_split > 1 only); the kernel leaves them zeroed."""
        self._go("reflex_attn", (n_tok, n_head, n_split), 128,
                 [c_void_p(q), c_void_p(k_cache), c_void_p(v_cache), c_void_p(kv_pos), c_void_p(q_pos), c_void_p(q_slot),
                  c_void_p(seg_lo or None), c_int(prefix_len), c_void_p(n_kv), c_void_p(out), c_void_p(part_o or None),
                  c_void_p(part_ml or None), c_void_p(counters or None), c_int(n_head), c_int(n_head_kv), c_int(hd),
                  c_int(hd_v), c_int(n_ctx), c_int(window), c_float(scale), c_float(softcap), c_int(n_split)])

    # -- multi-head latent attention (kernels/mla.cu) ----------------------------------------

    def mla_rope_store(self, q, qm, kv, kv_norm, pos, slot, cache, tab: MlaRope, attn_factor, n_tok, n_head, nope,
                       rope, r, eps) -> None:
        self._go("reflex_mla_rope_store", (n_tok, n_head + 1, 1), 128,
                 [c_void_p(q), c_void_p(qm), c_void_p(kv), c_void_p(kv_norm), c_void_p(pos), c_void_p(slot),
                  c_void_p(cache), tab, c_float(attn_factor), c_int(n_head), c_int(nope), c_int(rope), c_int(r),
                  c_float(eps)])

    def mla_heads(self, w: Weight, head_bytes: int, x: int, x_tok: int, x_head: int, y: int, y_tok: int, y_head: int,
                  n_tok: int, n_head: int) -> None:
        """y[t, h] = W_h x[t, h] for every head h (W_h: w.rows rows of w.k at w.ptr + h * head_bytes);
        x and y are strided float rows (tokens, heads). Tensor cores for large batches when K % 64 == 0."""
        args = [c_void_p(w.ptr), c_long(w.row_bytes), c_long(head_bytes), c_void_p(x), c_int(x_tok), c_int(x_head),
                c_void_p(y), c_int(y_tok), c_int(y_head), c_int(w.rows), c_int(w.k), c_int(n_tok)]
        if not matvec_path(n_tok) and w.k % 64 == 0:
            self._go(f"reflex_mla_mm_{w.suffix}", ((w.rows + 127) // 128, (n_tok + 63) // 64, n_head), 256, args)
            return
        wpr = self._wpr(w.rows * n_head, w.k)
        per_block = 8 // wpr
        self._go(f"reflex_mla_mv_{w.suffix}", ((w.rows + per_block - 1) // per_block, n_head, 1), 256, args + [c_int(wpr)])

    def mla_heads_t(self, w: Weight, head_bytes: int, x: int, x_tok: int, x_head: int, y: int, y_tok: int,
                    y_head: int, n_tok: int, n_head: int) -> None:
        """y[t, h] = W_h^T x[t, h]: W_h is w.rows rows of w.k (<= 2048), y rows of w.k floats."""
        assert w.k <= 2048
        self._go(f"reflex_mla_mv_t_{w.suffix}", (n_head, (n_tok + 3) // 4, 1), 256,
                 [c_void_p(w.ptr), c_long(w.row_bytes), c_long(head_bytes), c_void_p(x), c_int(x_tok), c_int(x_head),
                  c_void_p(y), c_int(y_tok), c_int(y_head), c_int(w.rows), c_int(w.k), c_int(n_tok)])

    def mla_attention(self, q, cache, q_slot, seg_lo, prefix_len, n_kv, out, part_o, part_ml, counters, n_tok, n_head,
                      r, d, scale, n_split) -> None:
        """counters: n_tok * ceil(n_head / MLA_HEADS) zeroed ints (n_split > 1 only); left zeroed."""
        groups = (n_head + MLA_HEADS - 1) // MLA_HEADS
        self._go("reflex_mla_attn", (n_tok, n_split, groups), 256,
                 [c_void_p(q), c_void_p(cache), c_void_p(q_slot), c_void_p(seg_lo or None), c_int(prefix_len),
                  c_void_p(n_kv), c_void_p(out), c_void_p(part_o or None), c_void_p(part_ml or None),
                  c_void_p(counters or None), c_int(n_head), c_int(r), c_int(d), c_float(scale), c_int(n_split)])

    # -- prompt attention on tensor cores (kernels/flash_attn.cu) -----------------------------

    def flash_ok(self, n_tok: int, hd: int, hd_v: int, n_head: int, n_head_kv: int) -> bool:
        """Whether a batch's attention runs flash_attn.cu (else reflex_attn)."""
        return (self.tc and n_tok >= FLASH_MIN_TOKENS and hd == hd_v and hd in FLASH_HEAD_DIMS
                and n_head // n_head_kv <= FLASH_ROWS and flash_shared_bytes(hd) <= self._max_shared)

    def flash_attention(self, q, k_cache, v_cache, kv_pos, q_pos, q_slot, seg_lo, prefix_len, n_kv, out, n_tok, n_head,
                        n_head_kv, hd, n_ctx, window, scale, softcap) -> None:
        """attention()'s result for n_tok query tokens on tensor cores (see flash_ok)."""
        bt = FLASH_ROWS // (n_head // n_head_kv)  # tokens per block
        self._go(f"reflex_flash_attn_{hd}", (-(-n_tok // bt), n_head_kv, 1), 128,
                 [c_void_p(q), c_void_p(k_cache), c_void_p(v_cache), c_void_p(kv_pos), c_void_p(q_pos), c_void_p(q_slot),
                  c_void_p(seg_lo or None), c_int(prefix_len), c_void_p(n_kv), c_void_p(out), c_int(n_tok), c_int(n_head),
                  c_int(n_head_kv), c_int(n_ctx), c_int(window), c_float(scale), c_float(softcap)],
                 flash_shared_bytes(hd))

    # -- Gated DeltaNet and sigmoid gates (kernels/delta_net.cu, kernels/gated.cu) ------------

    def dn_conv(self, x, w, state, state_stride, seq_start, n_seq, pos, out, n_tok, k, nk, nv, dk, dv, q_scale, eps,
                roll) -> None:
        """Causal conv + SiLU + q/k L2 norm of n_tok tokens; roll: every sequence is one token and
        the kernel shifts the conv state itself (else dn_conv_state must follow)."""
        self._go("reflex_dn_conv", (2 * nk + nv, (n_tok + 7) // 8, 1), 256,
                 [c_void_p(x), c_void_p(w), c_void_p(state), c_long(state_stride), c_void_p(seq_start or None),
                  c_int(n_seq), c_void_p(pos), c_void_p(out), c_int(n_tok), c_int(k), c_int(nk), c_int(nv), c_int(dk),
                  c_int(dv), c_float(q_scale), c_float(eps), c_int(int(roll))])

    def dn_conv_state(self, x, state, state_stride, seq_start, n_seq, pos, n_tok, channels, k) -> None:
        self._go("reflex_dn_conv_state", ((channels + 255) // 256, n_seq, 1), 256,
                 [c_void_p(x), c_void_p(state), c_long(state_stride), c_void_p(seq_start or None), c_int(n_seq),
                  c_void_p(pos), c_int(n_tok), c_int(channels), c_int(k)])

    def dn_recurrent(self, qkv, alpha, beta, z, ssm_a, dt_bias, norm_w, state, state_stride, seq_start, n_seq, pos, out,
                     n_tok, nk, nv, dk, dv, eps) -> None:
        """The delta rule token by token with the gated output norm fused (one block per value head and sequence)."""
        self._go("reflex_dn_recurrent", (nv, n_seq, 1), 256,
                 [c_void_p(qkv), c_void_p(alpha), c_void_p(beta), c_void_p(z), c_void_p(ssm_a), c_void_p(dt_bias),
                  c_void_p(norm_w), c_void_p(state), c_long(state_stride), c_void_p(seq_start or None), c_int(n_seq),
                  c_void_p(pos), c_void_p(out), c_int(n_tok), c_int(nk), c_int(nv), c_int(dk), c_int(dv), c_float(eps)])

    def dn_chunked(self, qkv, alpha, beta, ssm_a, dt_bias, state, state_stride, seq_start, n_seq, pos, out, n_tok, nk,
                   nv, dk, dv) -> None:
        """The delta rule DN_CHUNK tokens at a time; `out` gets the unnormalized output (dn_gated_norm next)."""
        self._go("reflex_dn_chunked", (nv, (dv + 31) // 32, n_seq), 256,
                 [c_void_p(qkv), c_void_p(alpha), c_void_p(beta), c_void_p(ssm_a), c_void_p(dt_bias), c_void_p(state),
                  c_long(state_stride), c_void_p(seq_start or None), c_int(n_seq), c_void_p(pos), c_void_p(out),
                  c_int(n_tok), c_int(nk), c_int(nv), c_int(dk), c_int(dv)])

    def dn_gated_norm(self, o, z, w, out, rows, dv, eps) -> None:
        self._go("reflex_dn_gated_norm", (rows + 7) // 8, 256,
                 [c_void_p(o), c_void_p(z), c_void_p(w), c_void_p(out), c_int(rows), c_int(dv), c_float(eps)])

    def gate_split(self, qg: int, q: int, gate: int, n: int, hd: int) -> None:
        """Per-head [query | gate] rows -> q, gate ((n / hd) rows of hd floats each)."""
        self._go("reflex_gate_split", (n + 255) // 256, 256,
                 [c_void_p(qg), c_void_p(q), c_void_p(gate), c_long(n), c_int(hd)])

    def sigmoid_mul(self, y: int, g: int, n: int, group: int = 1) -> None:
        """y[i] *= sigmoid(g[i // group]) for i < n."""
        self._go("reflex_sigmoid_mul", (n + 255) // 256, 256, [c_void_p(y), c_void_p(g), c_long(n), c_int(group)])

    # -- decode attention (kernels/attn_decode.cu) --------------------------------------------

    def attn_decode_splits(self, n_head_kv: int) -> int:
        """reflex_attn_decode's grid.y: about attn_blocks_per_sm blocks per SM at long contexts."""
        return max(1, min(ATTN_SPLITS_MAX, round(self.attn_blocks_per_sm * self.dev.sm_count / n_head_kv)))

    @staticmethod
    def _attn_decode_smem(group: int, hd: int, hd_v: int) -> int:
        return 4 * group * (hd + 32) + 64 * (2 * hd + 64) + 64 * (2 * hd_v + 64)

    def attn_decode_fits(self, n_head: int, n_head_kv: int, hd: int, hd_v: int) -> bool:
        """Whether reflex_attn_decode serves these heads (the caller may then fuse the rope into it)."""
        if not self.attn_decode or n_head % n_head_kv or hd % 32 or hd_v % 32 or hd > 256 or hd_v > 256:
            return False
        group = n_head // n_head_kv
        smem = self._attn_decode_smem(group, hd, hd_v)
        return group <= ATTN_DECODE_MAX_GROUP and smem <= self.dev.max_shared - 8 * 1024

    def attention_decode(self, q, k_cache, v_cache, kv_pos, q_pos, q_slot, n_kv, out, part_o, part_ml, counters,
                         n_head, n_head_kv, hd, hd_v, n_ctx, window, scale, softcap, prefetch: bool,
                         window_slots: bool = False, rope: AtdRope | None = None) -> bool:
        """One query token, all query heads of a KV head per block, the context split by its length
        (kernels/attn_decode.cu). part_o / part_ml hold n_head * ATTN_SPLITS_MAX slices; counters
        n_head_kv zeroed ints. prefetch: the cache rows before the newest were written two or more
        launches back (the decode graph). window_slots: slot j holds position j + c, so a sliding
        window bounds the slots read. rope: q is raw and the new key / value are rope.k / rope.v:
        the kernel normalizes, rotates and stores them (reflex_qk_rope_store's work for one token).
        False: not applicable, nothing launched."""
        if not self.attn_decode_fits(n_head, n_head_kv, hd, hd_v):
            return False
        if rope is not None and (rope.rope_dim > hd or rope.rope_dim % 2):
            return False
        group = n_head // n_head_kv
        smem = self._attn_decode_smem(group, hd, hd_v)
        self._go("reflex_attn_decode", (n_head_kv, self.attn_decode_splits(n_head_kv), 1), 128,
                 [c_void_p(q), c_void_p(k_cache), c_void_p(v_cache), c_void_p(kv_pos), c_void_p(q_pos), c_void_p(q_slot),
                  c_void_p(n_kv), c_void_p(out), c_void_p(part_o), c_void_p(part_ml), c_void_p(counters), c_int(n_head),
                  c_int(n_head_kv), c_int(hd), c_int(hd_v), c_int(n_ctx), c_int(window), c_float(scale),
                  c_float(softcap), c_int(max(1, self.attn_min_keys)), c_int(int(prefetch)), c_int(int(window_slots)),
                  rope if rope is not None else AtdRope()], smem)
        return True

    # -- sampling and scoring --------------------------------------------------------------

    def argmax(self, logits: int, n: int, part_v: int, part_i: int, n_part: int, state, last: int) -> None:
        self._go("reflex_argmax_partial", n_part, 1024, [c_void_p(logits), c_int(n), c_void_p(part_v), c_void_p(part_i)])
        self._go("reflex_argmax_final", 1, 32, [c_void_p(part_v), c_void_p(part_i), c_int(n_part), state, c_int(last)])

    def sample(self, logits: int, n: int, sampling_ptr: int, state, last: int) -> None:
        self._go("reflex_sample", 1, 1024, [c_void_p(logits), c_int(n), c_void_p(sampling_ptr), state, c_int(last)])

    def logprob_rows(self, logits: int, n_vocab: int, rows: int, tokens: int, out: int, n: int) -> None:
        self._go("reflex_logprob_rows", n, 1024, [c_void_p(logits), c_int(n_vocab), c_void_p(rows), c_void_p(tokens),
                                                   c_void_p(out)])

    # -- logprobs and grammar masks (kernels/constrain.cu) -------------------------------------

    def logit_stats(self, logits: int, n: int, k: int, part_f: int, part_i: int, n_part: int) -> None:
        """Per slice of the row: max, sum of exp(x - max), the k largest (value, id); part_f holds
        (2 + STATS_TOPK) floats and part_i STATS_TOPK ints per slice (gpu/logprobs.py merges them)."""
        self._go("reflex_logit_stats", n_part, 256, [c_void_p(logits), c_int(n), c_int(k), c_void_p(part_f),
                                                      c_void_p(part_i)])

    def mask_logits(self, logits: int, words: int, n: int) -> None:
        self._go("reflex_mask_logits", (n + 255) // 256, 256, [c_void_p(logits), c_void_p(words), c_int(n)])

    def token_logit(self, logits: int, tokens: int, out: int) -> None:
        self._go("reflex_token_logit", 1, 32, [c_void_p(logits), c_void_p(tokens), c_void_p(out)])
