"""kernels/matvec.cu: matrix-vector products of a few tokens (weights read once per 4 tokens of
a block; few rows and many tokens: the tokens spread over the grid's y, token_blocks),
up to three matrices of one type and row length per launch, an RMS norm of the input fused in;
and the gated form (act(gate x) * up x). The kernels of every batch size below the tensor-core
crossover (gpu/products.py)."""

from __future__ import annotations

from ctypes import Structure, c_float, c_int, c_long, c_void_p
from functools import lru_cache

from .common import Weight, per_type

KERNELS = per_type("reflex_mv_{}", "reflex_mv_glu_{}")


class MvSegs(Structure):
    """Mirror of kernels/matvec.cuh's MvSegs: up to three matrices in one launch."""

    _fields_ = [("w", c_void_p * 3), ("y", c_void_p * 3), ("rows", c_int * 3)]


def warps_per_row(L, rows: int, k: int) -> int:
    """Split K across warps when there are too few rows to fill the GPU and rows are long enough
    that every warp keeps >= 4 steps of 256 weights (measured on the H200: splitting 1024-long
    rows costs more in reductions than it gains). Also the rule of moe.cu's and mla.cu's
    matrix-vector kernels."""
    return _warps_per_row(L.target_warps, rows, k)


def _warps_per_row(target_warps: int, rows: int, k: int) -> int:
    wpr = 1
    while wpr < 8 and rows * wpr < target_warps and (wpr * 2) * 4 <= k // 256:
        wpr *= 2
    return wpr


def rows_per_warp(rows_per_segment: list[int], n_tok: int, wpr: int) -> int:
    """Rows per warp for one-token products: each x load then serves 2 or 4 rows."""
    if n_tok != 1 or wpr != 1:
        return 1
    total = sum(rows_per_segment)
    for r in (4, 2):
        if total >= 2048 * r and all(n % r == 0 for n in rows_per_segment):
            return r
    return 1


def token_blocks(L, blocks: int, n_tok: int) -> int:
    """The grid's y for n_tok tokens over `blocks` blocks of rows: enough blocks to fill the GPU
    (8 an SM) in all, each taking a run of whole 4-token steps. A 128 x 2,048 float32 router took
    32 blocks of 4 rows, each looping through 512 prompt tokens: 369 us a layer on the 30B shape."""
    steps = -(-n_tok // 4)  # MV_TOK
    return max(1, min(steps, -(-8 * L.dev.sm_count // blocks)))


def segments(L, ws: list[Weight], x: int, ys: list[int], n_tok: int, accumulate: bool = False, x_stride: int = 0,
             norm_w: int = 0, eps: float = 0.0) -> None:
    """ys[i] (+)= ws[i] x' for up to three matrices of one type and row length, one launch."""
    w0 = ws[0]
    assert 1 <= len(ws) <= 3 and all(w.k == w0.k and w.type_name == w0.type_name for w in ws)
    segs, wpr, rpw, blocks = _plan(tuple(ws), tuple(ys), n_tok == 1, L.target_warps)
    L.go(f"reflex_mv_{w0.suffix}", (blocks, token_blocks(L, blocks, n_tok), 1), 256,
         [segs, c_long(w0.row_bytes), c_void_p(x), c_int(x_stride or w0.k), c_int(w0.k), c_int(n_tok),
          c_int(int(accumulate)), c_void_p(norm_w or None), c_float(eps), c_int(wpr), c_int(rpw)])


@lru_cache(maxsize=4096)  # a layer's products take the same every prompt (building MvSegs: ~3 us a launch)
def _plan(ws: tuple, ys: tuple, one_token: bool, target_warps: int) -> tuple:
    """(MvSegs, warps a row, rows a warp, blocks) of segments' launch, never changed once made (a
    launch copies the struct's bytes; recorded launches keep it)."""
    segs = MvSegs()
    for i, (w, y) in enumerate(zip(ws, ys)):
        segs.w[i], segs.y[i], segs.rows[i] = w.ptr, y, w.rows
    total = sum(w.rows for w in ws)
    wpr = _warps_per_row(target_warps, total, ws[0].k)
    rpw = rows_per_warp([w.rows for w in ws], 1 if one_token else 2, wpr)
    per_block = 8 // wpr * rpw
    return segs, wpr, rpw, (total + per_block - 1) // per_block


def glu(L, wg: Weight, wu: Weight, x: int, out: int, n_tok: int, act: int, norm_w: int = 0, eps: float = 0.0) -> None:
    """out = act(Wg x') * (Wu x'), both of one type and row length, one launch."""
    wpr = warps_per_row(L, 2 * wg.rows, wg.k)
    per_block = 8 // wpr
    L.go(f"reflex_mv_glu_{wg.suffix}", (wg.rows + per_block - 1) // per_block, 256,
         [c_void_p(wg.ptr), c_void_p(wu.ptr), c_long(wg.row_bytes), c_void_p(x), c_int(wg.k), c_void_p(out),
          c_int(wg.rows), c_int(wg.rows), c_int(wg.k), c_int(n_tok), c_int(act), c_void_p(norm_w or None),
          c_float(eps), c_int(wpr)])
