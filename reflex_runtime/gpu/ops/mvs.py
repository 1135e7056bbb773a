"""kernels/mvs.cu: the decode step's one-token matrix-vector products, each block's weight rows
staged into shared memory (kernels/stage.cuh) before it waits for its predecessor: q/k/v-style
segments of one type (reflex_mvs_*) or of mixed types (reflex_mvs_mixed), the LM head with the
greedy pick fused (MvsPick), and gate/up (reflex_mvs_glu_*, dense or the routed experts' rows).
plan() sizes every staged launch, moe_decode.cu's too."""

from __future__ import annotations

from ctypes import Structure, c_float, c_int, c_long, c_void_p
from dataclasses import dataclass

from ...modelfile.ggml_types import GGML_TYPES_BY_NAME
from .common import Weight, per_type
from .matvec import MvSegs
from .sample import RxState

KERNELS = per_type("reflex_mvs_{}", "reflex_mvs_post_{}", "reflex_mvs_merge_{}", "reflex_mvs_glu_{}",
                   "reflex_mvs_glu_post_{}", "reflex_mvs_head_{}") + ("reflex_mvs_mixed", "reflex_mvs_mixed_post")
MVS_NX = 4  # a warp part covers 32 * 4 groups of 8 weights = 1024 weights of a row
MVS_STAGES = 4  # the streamed LM head's ring of shared-memory slots (kernels/mvs.cuh)
STATIC_SMEM_RESERVE = 5 * 1024  # static shared memory of the staged kernels (the router's top-k: 4.5 KB)


@dataclass(frozen=True)
class MvsPlan:
    """How a staged launch splits its rows: rb rows per block, wpr warps per row, smem bytes of
    dynamic shared memory per block."""

    rb: int
    wpr: int
    smem: int


class MvSegsMixed(Structure):
    """Mirror of kernels/mvs.cuh's MvSegsMixed: up to three matrices of any types, one launch."""

    _fields_ = [("w", c_void_p * 3), ("y", c_void_p * 3), ("row_bytes", c_long * 3), ("rows", c_int * 3),
                ("type", c_int * 3)]


class MvsPick(Structure):
    """Mirror of kernels/mvs.cuh's MvsPick: the greedy pick fused into an LM head launch."""

    _fields_ = [("part_v", c_void_p), ("part_i", c_void_p), ("counter", c_void_p), ("st", RxState), ("last", c_int)]


class MvsPost(Structure):
    """Mirror of kernels/mvs.cuh's MvsPost: a post-norm folded into a staged launch (src NULL: none)."""

    _fields_ = [("src", c_void_p), ("w", c_void_p), ("x_out", c_void_p), ("eps", c_float)]


class MvsMerge(Structure):
    """Mirror of kernels/mvs.cuh's MvsMerge: the decode attention's slices of one row, merged by the
    launch that reads its output (reflex_mvs_merge_*) when the attention left them (its defer)."""

    _fields_ = [("part_o", c_void_p), ("part_ml", c_void_p), ("n_kv", c_void_p), ("slot", c_void_p),
                ("max_split", c_int), ("min_keys", c_int), ("n_hg", c_int), ("window", c_int),
                ("window_slots", c_int), ("hd_v", c_int), ("defer", c_int)]


@dataclass(frozen=True)
class Post:
    """A post-norm the next staged launch folds in (Gemma's sandwich): its input is x + norm(src) * w,
    which block (0, 0) also leaves in x_out (kernels/mvs.cuh mvs_post_x)."""

    src: int
    w: int
    x_out: int
    eps: float


def _post_args(post: Post | None, merge: MvsMerge | None = None) -> tuple[str, list]:
    """The kernel name's infix and the trailing argument: the _post kernels take an MvsPost, the
    _merge ones an MvsMerge, the others (the code most files run, unchanged by either) none."""
    if merge is not None:
        return "merge_", [merge]
    return ("post_", [MvsPost(post.src, post.w, post.x_out, post.eps)]) if post else ("", [])


def stage_bytes(n: int) -> int:
    """kernels/stage.cuh rx_stage_bytes: shared memory that staging n bytes takes."""
    return (n + 30 + 15) & ~15


def plan(L, rows: int, row_bytes: int, k: int, ranges: int = 1, extra: int = 0, groups: int = 1,
         post: bool = False) -> MvsPlan | None:
    """Rows per block for `rows` rows of `row_bytes` (each block stages `ranges` runs of rb rows
    plus `extra` bytes; groups: the rows are that many equal runs, each in its own blocks, as the
    routed experts' slots): about one block per SM (L.mvs_blocks_per_sm) while the weights fit the
    budget (L.mvs_budget), else budget-sized blocks in waves (at least one row each, past the
    budget if the device has room), larger where that saves a partly empty last wave (_whole_waves);
    with post (a folded post-norm), room for x in shared memory, where kernels/mvs.cuh mvs_post_x
    makes it. None when that does not fit the device."""
    wpr = _warps_per_row(k)
    if wpr is None:
        return None

    def smem_of(r: int) -> int:
        return ranges * stage_bytes(r * row_bytes) + ranges * r * wpr * 4 + extra

    cap = max(1, (L.mvs_budget - extra) // (ranges * row_bytes))
    rb = min(-(-rows // (L.dev.sm_count * L.mvs_blocks_per_sm)), cap)
    if L.mvs_waves:
        rb = _whole_waves(L, rb, rows // groups, groups, smem_of)
    smem = smem_of(rb)
    if smem > L.dev.max_shared - STATIC_SMEM_RESERVE:
        return None
    if post:  # the room for x is needed: refused where it would cost an SM one of two blocks
        if not _x_fits(L, smem, xs_bytes(k)):
            return None
        smem += xs_bytes(k)
    return MvsPlan(rb, wpr, smem)


def _warps_per_row(k: int) -> int | None:
    """Warps sharing a row of k weights (a warp part covers 32 * MVS_NX groups of 8); None past 8."""
    wpr = 1
    while k > 8 * 32 * MVS_NX * wpr:
        wpr *= 2
    return None if wpr > 8 or k % 8 else wpr


def _blocks_per_sm(L, smem: int) -> int:
    """Staged blocks of `smem` dynamic shared memory an SM holds (8 at most: 256 threads each)."""
    return min(8, L.dev.smem_per_sm // (smem + STATIC_SMEM_RESERVE + 1024))


def xs_bytes(k: int) -> int:
    """Shared memory for x (k floats) in kernels/mvs.cuh mvs_post_x, after the block's 16-byte aligned sums."""
    return 4 * k + 16


def _x_fits(L, smem: int, xs: int) -> bool:
    """Whether a block may take xs more bytes: they fit, and an SM still holds two of its blocks
    where it held two (the next kernel's copies overlap this one)."""
    return (smem + xs <= L.dev.max_shared - STATIC_SMEM_RESERVE
            and _blocks_per_sm(L, smem + xs) >= min(2, _blocks_per_sm(L, smem)))


def _whole_waves(L, rb: int, rows: int, groups: int, smem_of) -> int:
    """rb, or the block size that takes the launch in fewer rows per SM when rb leaves a last wave
    partly empty: the time of a bandwidth-bound launch is about its waves x the rows of a block.
    (The Qwen3-30B-A3B shape's expert gate/up: 22 rows a block made 280 blocks for 264 places, two
    waves; 24 rows make 256, one wave: 1,005 -> 673 us a token, results/2026-12-03-h200-s17.)
    Larger blocks only, while two still fit an SM (the next launch's copies overlap this one's
    work): smaller ones in more blocks an SM measured slower (12 rows, 512 blocks: 901 us)."""
    sm, room = L.dev.sm_count, L.dev.max_shared - STATIC_SMEM_RESERVE

    def per_sm(r: int) -> int:
        return _blocks_per_sm(L, smem_of(r))

    def waves(r: int) -> int:
        return -(-groups * -(-rows // r) // (sm * max(1, per_sm(r))))

    if waves(rb) <= 1:
        return rb
    top = rb
    while top < rows and per_sm(top + 1) >= 2 and smem_of(top + 1) <= room:
        top += 1
    return min(range(rb, top + 1), key=lambda r: (waves(r) * r, r))


def stageable(L, ws, *ptrs) -> bool:
    """The staged kernels read x with 16-byte loads and rows as matvec.cu does."""
    return L.staged and not any(p % 16 for p in ptrs) and not any(w.ptr % 16 for w in ws)


def _pick(part_v: int = 0, part_i: int = 0, counter: int = 0, state=None, last: int = 0) -> MvsPick:
    """An MvsPick (all zero: no fused pick)."""
    pick = MvsPick()
    if part_v:
        pick.part_v, pick.part_i, pick.counter, pick.st, pick.last = part_v, part_i, counter, state, last
    return pick


def folds_post(L, ws: list[Weight], ranges: int = 1) -> bool:
    """Whether segments(ws) (ranges 1) or glu(*ws) (ranges 2) would take a folded post-norm
    (L.post_fold; the launch has room for x in shared memory)."""
    w0 = ws[0]
    if not (L.post_fold and stageable(L, ws) and all(w.k == w0.k for w in ws)):
        return False
    rows = sum(w.rows for w in ws) if ranges == 1 else w0.rows
    return plan(L, rows, max(w.row_bytes for w in ws), w0.k, ranges=ranges, post=True) is not None


def _post_ok(L, post: Post | None) -> bool:
    return post is None or stageable(L, [], post.src, post.w, post.x_out)


def takes_merge(L, w: Weight, x: int) -> bool:
    """Whether segments([w], x, ..., merge=...) would launch reflex_mvs_merge_* (staged, room for x
    in shared memory, where kernels/mvs.cuh mvs_merge_x makes it), for an input of at most
    L.attn_out_merge_k (by default 1,024: one warp a row). Measured on an H100
    (results/2026-12-05-h100-s33): the Gemma 3 270M shape's output projection (K = 1,024) decodes
    1.027x faster with it; Qwen3-0.6B's (K = 2,048, two warps a row) 0.90x, and 0.91x with the
    kernel merging nothing: its cost there is the kernel's own, not yet understood."""
    return (w.k <= L.attn_out_merge_k and stageable(L, [w], x)
            and plan(L, w.rows, w.row_bytes, w.k, post=True) is not None)


def segments(L, ws: list[Weight], x: int, ys: list[int], accumulate: bool, norm_w: int, eps: float,
             post: Post | None = None, merge: MvsMerge | None = None) -> bool:
    """ys[i] (+)= ws[i] x' for one token, matrices of one K (reflex_mvs_*, or reflex_mvs_mixed
    when their types differ); post: a post-norm folded in; merge (one matrix, no post, where
    takes_merge said so): x is the decode attention's output, merged from its slices when it left
    them (reflex_mvs_merge_*). False: not applicable, nothing launched."""
    w0 = ws[0]
    if not stageable(L, ws, x, norm_w) or any(w.k != w0.k for w in ws) or not _post_ok(L, post):
        return False
    assert merge is None or (len(ws) == 1 and post is None and not norm_w), "a merged input is one matrix's, unnormed"
    p = plan(L, sum(w.rows for w in ws), max(w.row_bytes for w in ws), w0.k, post=post is not None or merge is not None)
    if p is None:
        return False
    blocks = sum(-(-w.rows // p.rb) for w in ws)
    infix, post_arg = _post_args(post, merge)
    if any(w.type_name != w0.type_name for w in ws):
        mixed = MvSegsMixed()
        for i, (w, y) in enumerate(zip(ws, ys)):
            mixed.w[i], mixed.y[i], mixed.row_bytes[i], mixed.rows[i], mixed.type[i] = (
                w.ptr, y, w.row_bytes, w.rows, GGML_TYPES_BY_NAME[w.type_name].type_id)
        L.go(f"reflex_mvs_mixed{'_post' if post else ''}", blocks, 256,
             [mixed, c_void_p(x), c_int(w0.k), c_int(p.rb), c_int(p.wpr), c_int(int(accumulate)),
              c_void_p(norm_w or None), c_float(eps), *post_arg], p.smem)
        return True
    segs = MvSegs()
    for i, (w, y) in enumerate(zip(ws, ys)):
        segs.w[i], segs.y[i], segs.rows[i] = w.ptr, y, w.rows
    L.go(f"reflex_mvs_{infix}{w0.suffix}", blocks, 256,
         [segs, c_long(w0.row_bytes), c_void_p(x), c_int(w0.k), c_int(p.rb), c_int(p.wpr),
          c_int(int(accumulate)), c_void_p(norm_w or None), c_float(eps), _pick(), *post_arg], p.smem)
    return True


@dataclass(frozen=True)
class StreamPlan:
    """The streamed LM head's split: rpb rows per block walked in chunks of `chunk` rows."""

    blocks: int
    rpb: int
    chunk: int
    wpr: int
    smem: int


def plan_stream(L, rows: int, row_bytes: int, k: int) -> StreamPlan | None:
    """L.mvs_head_stream resident blocks per SM (fewer if their ring does not fit), each with a
    ring of MVS_STAGES chunks of about L.mvs_budget / MVS_STAGES bytes; None when one row's ring
    does not fit."""
    wpr = _warps_per_row(k)
    if wpr is None:
        return None
    room = L.dev.max_shared - STATIC_SMEM_RESERVE
    chunk = max(1, L.mvs_budget // MVS_STAGES // row_bytes)

    def smem_of(c: int) -> int:
        return MVS_STAGES * stage_bytes(c * row_bytes) + c * wpr * 4

    while chunk > 1 and smem_of(chunk) > room:
        chunk -= 1
    if smem_of(chunk) > room:
        return None
    per_sm = max(1, min(L.mvs_head_stream, _blocks_per_sm(L, smem_of(chunk))))
    rpb = -(-rows // (L.dev.sm_count * per_sm))
    chunk = min(chunk, rpb)  # a small matrix: no slots for rows a block does not have
    return StreamPlan(-(-rows // rpb), rpb, chunk, wpr, smem_of(chunk))


def head(L, w: Weight, x: int, y: int, norm_w: int, eps: float, pick=None) -> bool:
    """logits = W x' for one token. pick = (part_v, part_i, counter, state, last): also take the
    greedy argmax and advance the decode state (float part_v / int part_i arrays of at least
    w.rows entries, a zeroed int counter). With L.mvs_head_stream, resident blocks stream their
    rows (reflex_mvs_head_*). False: not applicable, nothing launched."""
    if not stageable(L, [w], x, norm_w):
        return False
    sp = plan_stream(L, w.rows, w.row_bytes, w.k) if L.mvs_head_stream else None
    if sp is not None:
        L.go(f"reflex_mvs_head_{w.suffix}", sp.blocks, 256,
             [c_void_p(w.ptr), c_void_p(y), c_int(w.rows), c_long(w.row_bytes), c_void_p(x), c_int(w.k),
              c_int(sp.rpb), c_int(sp.chunk), c_int(sp.wpr), c_void_p(norm_w or None), c_float(eps),
              _pick(*pick) if pick else _pick()], sp.smem)
        return True
    p = plan(L, w.rows, w.row_bytes, w.k)
    if p is None:
        return False
    segs = MvSegs()
    segs.w[0], segs.y[0], segs.rows[0] = w.ptr, y, w.rows
    L.go(f"reflex_mvs_{w.suffix}", -(-w.rows // p.rb), 256,
         [segs, c_long(w.row_bytes), c_void_p(x), c_int(w.k), c_int(p.rb), c_int(p.wpr), c_int(0),
          c_void_p(norm_w or None), c_float(eps), _pick(*pick) if pick else _pick()], p.smem)
    return True


def glu(L, wg: Weight, wu: Weight, x: int, out: int, act: int, norm_w: int = 0, eps: float = 0.0,
        post: Post | None = None) -> bool:
    """out = act(Wg x') * (Wu x') for one token, both of one type and row length; post: a post-norm
    folded in. False: not applicable, nothing launched."""
    if not stageable(L, [wg, wu], x, norm_w) or not _post_ok(L, post):
        return False
    p = plan(L, wg.rows, wg.row_bytes, wg.k, ranges=2, post=post is not None)
    if p is None:
        return False
    infix, post_arg = _post_args(post)
    L.go(f"reflex_mvs_glu_{infix}{wg.suffix}", -(-wg.rows // p.rb), 256,
         [c_void_p(wg.ptr), c_void_p(wu.ptr), c_long(wg.row_bytes), c_long(0), c_void_p(None),
          c_void_p(x), c_void_p(norm_w or None), c_float(eps), c_void_p(out), c_int(wg.rows),
          c_int(wg.k), c_int(p.rb), c_int(p.wpr), c_int(act), c_void_p(None), c_void_p(None), *post_arg], p.smem)
    return True


def slot_fits(w: Weight, expert: Weight, rows: int) -> bool:
    """A shared expert's matrix can be one more slot of the routed experts' launches: their type,
    row length and rows per expert."""
    return (w.type_name, w.row_bytes, w.k, w.rows) == (expert.type_name, expert.row_bytes, expert.k, rows)


def expert_glu(L, wg: Weight, wu: Weight, expert_bytes: int, ids: int, k: int, x: int, out: int, n_ff: int, act: int,
               norm_w: int = 0, eps: float = 0.0, shared: tuple[Weight, Weight] | None = None) -> bool:
    """One token: out[s] = act(gate_e x') * (up_e x') for its k routed slots (e = ids[s]), the
    routed rows staged after the wait; shared: a shared expert's (gate, up) as slot k (slot_fits),
    staged before it. False: not applicable."""
    if shared and not all(slot_fits(w, wg, n_ff) for w in shared):
        return False
    slots = k + bool(shared)
    if not stageable(L, [wg, wu, *(shared or ())], x, norm_w, expert_bytes):
        return False
    p = plan(L, n_ff * slots, wg.row_bytes, wg.k, ranges=2, groups=slots)
    if p is None:
        return False
    sg, su = shared or (None, None)
    L.go(f"reflex_mvs_glu_{wg.suffix}", (-(-n_ff // p.rb), slots, 1), 256,
         [c_void_p(wg.ptr), c_void_p(wu.ptr), c_long(wg.row_bytes), c_long(expert_bytes), c_void_p(ids),
          c_void_p(x), c_void_p(norm_w or None), c_float(eps), c_void_p(out), c_int(n_ff), c_int(wg.k),
          c_int(p.rb), c_int(p.wpr), c_int(act), c_void_p(sg.ptr if sg else None), c_void_p(su.ptr if su else None)],
         p.smem)
    return True
