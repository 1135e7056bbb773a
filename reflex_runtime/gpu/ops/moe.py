"""kernels/moe.cu: the routed experts read from their stacked GGUF tensors: softmax top-k
routing, the per-pair matrix-vector gate/up and down (small batches), the grouping of pairs by
expert (and the 64-pair tiles gemm.cu's grouped kernels run), and for GPUs older than sm_80 the
WMMA expert products and their weighted sum."""

from __future__ import annotations

from ctypes import c_float, c_int, c_long, c_void_p
from dataclasses import dataclass

from .common import Weight, per_type
from .matvec import MvSegs, warps_per_row

KERNELS = per_type("reflex_moe_mv_glu_{}", "reflex_moe_mv_down_{}", "reflex_moe_mm_{}") + (
    "reflex_moe_topk", "reflex_moe_group", "reflex_moe_combine", "reflex_moe_router_mm")
MAX_EXPERTS = 1024  # MOE_MAX_EXPERTS (router probabilities live in shared memory)
TILE = 64  # pairs per tile of the grouped expert kernels (gemm.cu GemmMoeW; SMALL_TILE: GemmMoeN, the "_n" kernels)
SMALL_TILE = 32
ROUTER_MM_T, ROUTER_MM_KT = 32, 64  # reflex_moe_router_mm's tile (RM_T) and K step (RM_KT)
ROUTER_MM_MIN_TOKENS = 16  # fewer: the matrix-vector kernel reads the router fewer times
ROUTER_MM_SLAB = ROUTER_MM_T * ROUTER_MM_T + ROUTER_MM_T  # floats of one (tile, K slice) partial (RM_SLAB)
ROUTER_MM_MAX_SPLITS = 8
ROUTER_MM_MAX_PARTS = 512  # (tile, slice) slabs of the scratch: router_mm_scratch's size


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
    tile: int = TILE  # pairs per tile: TILE or SMALL_TILE (which kernels gemm.moe_glu / moe_down launch)


def max_tiles(n_pairs: int, n_expert: int, tile: int = TILE) -> int:
    """Tiles of `tile` pairs over all experts, at most: one partial tile per expert used."""
    return -(-n_pairs // tile) + min(n_expert, n_pairs)


def tile_for(L) -> int:
    """Pairs per grouped tile: TILE (gemm.cu's W tiles: one per expert of up to 64 pairs, its
    empty 16-pair parts skipped; the 32-pair tiles they replace took ~1.5 per expert at 512
    tokens, each decoding the expert's weights again), unless L.moe_tile (REFLEX_MOE_TILE) forces one."""
    return L.moe_tile or TILE


def router_mm_scratch() -> list[tuple[str, int]]:
    """(name, floats/ints) of the arena buffers router_mm's K slices need (counters: zeroed)."""
    return [("moe_router_part", ROUTER_MM_MAX_PARTS * ROUTER_MM_SLAB), ("moe_router_counters", ROUTER_MM_MAX_PARTS)]


def router_mm_splits(L, tiles: int, k: int) -> int:
    """K slices per tile: doubled while the launch has fewer blocks than SMs (a 512-token prompt
    has 32-64 tiles of 32 K steps each: latency-bound), each slice whole K steps."""
    s = 1
    while (s < min(ROUTER_MM_MAX_SPLITS, L.router_splits) and tiles * s < L.dev.sm_count
           and tiles * 2 * s <= ROUTER_MM_MAX_PARTS
           and k % (2 * s * ROUTER_MM_KT) == 0):
        s *= 2
    return s


def router_mm(L, ws: list[Weight], x: int, ys: list[int], n_tok: int, norm_w: int = 0, eps: float = 0.0,
              scratch: tuple[int, int] = (0, 0)) -> bool:
    """ys[i] = ws[i] x' for a prompt's n_tok tokens: float32 matrices of one row length (the
    router, a shared expert's gate) in a float32 tiled GEMM, K cut into slices when its tiles
    leave SMs idle and `scratch` (router_mm_scratch's part and counters) is given. False: not
    applicable (a short batch, other weight types, a row length off RM_KT; L.router_mm off),
    nothing launched."""
    w0 = ws[0]
    if (not L.router_mm or n_tok < ROUTER_MM_MIN_TOKENS or len(ws) > 3 or w0.k % ROUTER_MM_KT
            or any(w.type_name != "F32" or w.k != w0.k or w.row_bytes != 4 * w.k or w.ptr % 16 for w in ws)
            or x % 16 or norm_w % 16):
        return False
    segs = MvSegs()
    for i, (w, y) in enumerate(zip(ws, ys)):
        segs.w[i], segs.y[i], segs.rows[i] = w.ptr, y, w.rows
    rows = sum(w.rows for w in ws)
    grid = (-(-rows // ROUTER_MM_T), -(-n_tok // ROUTER_MM_T))
    splits = router_mm_splits(L, grid[0] * grid[1], w0.k) if scratch[0] else 1
    L.go("reflex_moe_router_mm", (*grid, splits), 128,
         [segs, c_void_p(x), c_int(w0.k), c_int(w0.k), c_int(n_tok), c_void_p(norm_w or None), c_float(eps),
          c_void_p(scratch[0] or None), c_void_p(scratch[1] or None)])
    return True


def topk(L, logits: int, n_tok: int, n_expert: int, k: int, normalize: bool, ids: int, weights: int) -> None:
    L.go("reflex_moe_topk", n_tok, 256, [c_void_p(logits), c_int(n_expert), c_int(k), c_int(int(normalize)),
                                          c_void_p(ids), c_void_p(weights)])


def glu_mv(L, wg: Weight, wu: Weight, expert_bytes: int, ids: int, k: int, x: int, out: int, n_tok: int, n_ff: int,
           act: int, norm_w: int = 0, eps: float = 0.0) -> None:
    """out[t*k+s] = act(gate_e x'[t]) * (up_e x'[t]) for expert e = ids[t*k+s], one launch."""
    wpr = warps_per_row(L, n_ff * n_tok * k, wg.k)
    per_block = 8 // wpr
    L.go(f"reflex_moe_mv_glu_{wg.suffix}", ((n_ff + per_block - 1) // per_block, n_tok * k, 1), 256,
         [c_void_p(wg.ptr), c_void_p(wu.ptr), c_long(wg.row_bytes), c_long(expert_bytes), c_void_p(ids), c_int(k),
          c_void_p(x), c_int(wg.k), c_void_p(out), c_int(n_ff), c_int(wg.k), c_int(act), c_void_p(norm_w or None),
          c_float(eps), c_int(wpr)])


def down_mv(L, wd: Weight, expert_bytes: int, ids: int, weights: int, k: int, act: int, x: int, n_tok: int,
            n_embd: int) -> None:
    """x[t] += sum over t's k slots of weight * down_e act[t*k+s] (the residual add fused)."""
    wpr = warps_per_row(L, n_embd * n_tok, wd.k)
    per_block = 8 // wpr
    L.go(f"reflex_moe_mv_down_{wd.suffix}", ((n_embd + per_block - 1) // per_block, n_tok, 1), 256,
         [c_void_p(wd.ptr), c_long(wd.row_bytes), c_long(expert_bytes), c_void_p(ids), c_void_p(weights), c_int(k),
          c_void_p(act), c_int(wd.k), c_void_p(x), c_int(n_embd), c_int(wpr)])


def group(L, ids: int, n_pairs: int, n_expert: int, k: int, counts: int, offsets: int, pair_tok: int, pair_id: int,
          tile_e: int = 0, tile_m0: int = 0, n_tiles: int = 0, tile: int = TILE) -> None:
    """Sort the n_pairs (token, slot) pairs by expert; with tile_e, also list the tiles of `tile`
    pairs the grouped sm_80+ kernels run (at most max_tiles(n_pairs, n_expert, tile))."""
    L.go("reflex_moe_group", 1, 1024, [c_void_p(ids), c_int(n_pairs), c_int(n_expert), c_int(k), c_void_p(counts),
                                       c_void_p(offsets), c_void_p(pair_tok), c_void_p(pair_id), c_int(tile),
                                       c_void_p(tile_e or None), c_void_p(tile_m0 or None), c_void_p(n_tiles or None)])


def mm(L, w: Weight, expert_bytes: int, n_expert: int, n_rows: int, counts: int, offsets: int, x_idx: int, y_idx: int,
       x: int, y: int) -> None:
    """y[y_idx[i]] = W_e x[x_idx[i]] for the rows i of every expert's group, on tensor cores (WMMA)."""
    L.go(f"reflex_moe_mm_{w.suffix}", ((n_rows + 127) // 128, n_expert, 1), 256,
         [c_void_p(w.ptr), c_long(w.row_bytes), c_long(expert_bytes), c_void_p(counts), c_void_p(offsets),
          c_void_p(x_idx), c_void_p(y_idx), c_void_p(x), c_int(w.k), c_void_p(y), c_int(n_rows), c_int(n_rows),
          c_int(w.k)])


def combine(L, y: int, weights: int, k: int, x: int, n_embd: int, n_tok: int) -> None:
    L.go("reflex_moe_combine", (n_tok * n_embd + 255) // 256, 256,
         [c_void_p(y), c_void_p(weights), c_int(k), c_void_p(x), c_int(n_embd), c_int(n_tok)])
