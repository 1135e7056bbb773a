"""Typed launchers for the kernels in kernels/*.cu: one method per op, argument packs in the
kernel's parameter order, and the one place that chooses between the matrix-vector and the
tensor-core paths (`matvec_path`). Every method only enqueues work on the launcher's stream (so it
can be captured into a graph). `record()` keeps each launch with the role the calling block gave
it and the weight bytes it reads, which is how `reflex bench` times a decode step kind by kind.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from ctypes import Structure, c_float, c_int, c_long, c_void_p
from dataclasses import dataclass

from ..errors import UnsupportedModelError
from .kernels import WEIGHT_TYPES

# From this many tokens a matrix product goes to the tensor-core kernel (weights read once per
# 64 tokens) instead of the matrix-vector kernel (weights read once per 4 tokens). Below it the
# matrix-vector path wins on the H200: a 16-token prefill of Qwen3-0.6B took 22 ms through the
# tensor-core kernel (too few tiles to fill the GPU), and 16/4 weight passes cost ~3 ms.
MM_MIN_TOKENS = 64
ATTN_SPLITS_DECODE = 16  # reflex_attn's slices for one token (the legacy decode attention)
ATTN_SPLITS_MAX = 64  # reflex_attn_decode's most slices per KV head (kernels/attn_decode.cu)
ATTN_DECODE_MAX_GROUP = 16  # query heads per KV head it serves
MVS_NX = 4  # kernels/mvs.cu: a warp part covers 32 * 4 groups of 8 weights = 1024 weights of a row
STATIC_SMEM_RESERVE = 5 * 1024  # static shared memory of the staged kernels (the router's top-k: 4.5 KB)

# The decode step's kernels (one token): "staged" = kernels/mvs.cu, moe_decode.cu and
# attn_decode.cu; "legacy" = the matrix-vector and attention kernels every batch size can use.
# The launcher's attributes (staged, attn_decode, the plans' knobs) are what the bench varies.
DECODE_KERNELS = os.environ.get("REFLEX_DECODE_KERNELS", "staged")


def matvec_path(n_tok: int) -> bool:
    """True when a batch of n_tok tokens runs the matrix-vector kernels (which can fold an RMS
    norm of their input in); False when it runs the tensor-core kernels. Blocks ask this; no
    other code compares against MM_MIN_TOKENS."""
    return n_tok < MM_MIN_TOKENS


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
        # Decode-step kernels and their knobs (kernels/mvs.cu, attn_decode.cu; the bench varies them).
        self.staged = self.attn_decode = DECODE_KERNELS != "legacy"
        self.mvs_blocks_per_sm = int(os.environ.get("REFLEX_MVS_BLOCKS_PER_SM", "1"))
        # Weight bytes one block stages: two blocks of consecutive kernels must fit on an SM together,
        # so the next kernel's copies can run while this one computes.
        per_sm = getattr(device, "smem_per_sm", 0) or 100 * 1024
        per_block = getattr(device, "smem_per_block", 0) or 48 * 1024
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
        if smem > getattr(self.dev, "smem_per_block", 48 * 1024) - STATIC_SMEM_RESERVE:
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
        x_stride = x_stride or w.k
        if not matvec_path(n_tok) and w.k % 64 == 0 and not norm_w:
            self._go(f"reflex_mm_{w.suffix}", ((w.rows + 127) // 128, (n_tok + 63) // 64, 1), 256,
                     [c_void_p(w.ptr), c_long(w.row_bytes), c_void_p(x), c_int(x_stride), c_void_p(y), c_int(w.rows),
                      c_int(w.rows), c_int(w.k), c_int(n_tok), c_int(int(accumulate))])
            return
        self.matmul_segments([w], x, [y], n_tok, accumulate, x_stride, norm_w, eps)

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
        """out = act(Wg x') * (Wu x'); one fused pass when both weights share a type and the batch is
        small (x' normalized on the fly when norm_w is given; large batches must pass a normalized x)."""
        same = wg.type_name == wu.type_name and wg.row_bytes == wu.row_bytes
        if same and n_tok == 1 and self._stageable([wg, wu], x, norm_w):
            plan = self._mvs_plan(wg.rows, wg.row_bytes, wg.k, ranges=2)
            if plan is not None:
                self._go(f"reflex_mvs_glu_{wg.suffix}", -(-wg.rows // plan.rb), 256,
                         [c_void_p(wg.ptr), c_void_p(wu.ptr), c_long(wg.row_bytes), c_long(0), c_void_p(None),
                          c_void_p(x), c_void_p(norm_w or None), c_float(eps), c_void_p(out), c_int(wg.rows),
                          c_int(wg.k), c_int(plan.rb), c_int(plan.wpr), c_int(act)], plan.smem)
                return
        if same and matvec_path(n_tok):
            wpr = self._wpr(2 * wg.rows, wg.k)
            per_block = 8 // wpr
            self._go(f"reflex_mv_glu_{wg.suffix}", (wg.rows + per_block - 1) // per_block, 256,
                     [c_void_p(wg.ptr), c_void_p(wu.ptr), c_long(wg.row_bytes), c_void_p(x), c_int(wg.k), c_void_p(out),
                      c_int(wg.rows), c_int(wg.rows), c_int(wg.k), c_int(n_tok), c_int(act), c_void_p(norm_w or None),
                      c_float(eps), c_int(wpr)])
            return
        self.matmul(wg, x, g_buf, n_tok, norm_w=norm_w, eps=eps)
        self.matmul(wu, x, u_buf, n_tok, norm_w=norm_w, eps=eps)
        self.glu(g_buf, u_buf, out, n_tok * wg.rows, act)

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
                  pair_id: int) -> None:
        self._go("reflex_moe_group", 1, 1024, [c_void_p(ids), c_int(n_pairs), c_int(n_expert), c_int(k), c_void_p(counts),
                                               c_void_p(offsets), c_void_p(pair_tok), c_void_p(pair_id)])

    def moe_mm(self, w: Weight, expert_bytes: int, n_expert: int, n_rows: int, counts: int, offsets: int, x_idx: int,
               y_idx: int, x: int, y: int) -> None:
        """y[y_idx[i]] = W_e x[x_idx[i]] for the rows i of every expert's group, on tensor cores."""
        self._go(f"reflex_moe_mm_{w.suffix}", ((n_rows + 127) // 128, n_expert, 1), 256,
                 [c_void_p(w.ptr), c_long(w.row_bytes), c_long(expert_bytes), c_void_p(counts), c_void_p(offsets),
                  c_void_p(x_idx), c_void_p(y_idx), c_void_p(x), c_int(w.k), c_void_p(y), c_int(n_rows), c_int(n_rows),
                  c_int(w.k)])

    def moe_combine(self, y: int, weights: int, k: int, x: int, n_embd: int, n_tok: int) -> None:
        self._go("reflex_moe_combine", (n_tok * n_embd + 255) // 256, 256,
                 [c_void_p(y), c_void_p(weights), c_int(k), c_void_p(x), c_int(n_embd), c_int(n_tok)])

    # -- attention -------------------------------------------------------------------------

    def qk_rope_store(self, q, k, v, q_norm, k_norm, pos, slot, kv_pos, k_cache, v_cache, n_tok, n_head, n_head_kv,
                      hd, hd_v, rope_dim, base, freq_scale, eps, n_ctx) -> None:
        self._go("reflex_qk_rope_store", (n_tok, n_head + n_head_kv, 1), 128,
                 [c_void_p(q), c_void_p(k), c_void_p(v), c_void_p(q_norm or None), c_void_p(k_norm or None), c_void_p(pos),
                  c_void_p(slot), c_void_p(kv_pos), c_void_p(k_cache), c_void_p(v_cache), c_int(n_head), c_int(n_head_kv),
                  c_int(hd), c_int(hd_v), c_int(rope_dim), c_float(base), c_float(freq_scale), c_float(eps), c_int(n_ctx)])

    def attention(self, q, k_cache, v_cache, kv_pos, q_pos, q_slot, seg_lo, prefix_len, n_kv, out, part_o, part_ml,
                  counters, n_tok, n_head, n_head_kv, hd, hd_v, n_ctx, window, scale, softcap, n_split) -> None:
        """counters: n_tok * n_head zeroed ints (n_split > 1 only); the kernel leaves them zeroed."""
        self._go("reflex_attn", (n_tok, n_head, n_split), 128,
                 [c_void_p(q), c_void_p(k_cache), c_void_p(v_cache), c_void_p(kv_pos), c_void_p(q_pos), c_void_p(q_slot),
                  c_void_p(seg_lo or None), c_int(prefix_len), c_void_p(n_kv), c_void_p(out), c_void_p(part_o or None),
                  c_void_p(part_ml or None), c_void_p(counters or None), c_int(n_head), c_int(n_head_kv), c_int(hd),
                  c_int(hd_v), c_int(n_ctx), c_int(window), c_float(scale), c_float(softcap), c_int(n_split)])

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
        return group <= ATTN_DECODE_MAX_GROUP and smem <= getattr(self.dev, "smem_per_block", 48 * 1024) - 8 * 1024

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
