"""kernels/gemm.cu: the sm_80+ prompt kernels (mma.sync m16n8k16 with cp.async pipelines): up to
three matrices of one type and K per launch, gate and up fused with the activation, and the
grouped expert products over reflex_moe_group's tiles (their activations in f16: to_half makes
their input rows). Two tile configurations each."""

from __future__ import annotations

from ctypes import Structure, c_int, c_long, c_void_p
from functools import lru_cache

from ...modelfile.ggml_types import GGML_TYPES_BY_NAME
from .common import Weight, per_type
from .moe import SMALL_TILE, TILE, MoeGroups

KERNELS = per_type("reflex_gemm_{}_l", "reflex_gemm_{}_s", "reflex_gemm_glu_{}_l", "reflex_gemm_glu_{}_s",
                   "reflex_moe_gemm_glu_{}", "reflex_moe_gemm_down_{}", "reflex_moe_gemm_glu_{}_n",
                   "reflex_moe_gemm_down_{}_n") + ("reflex_gemm_to_half",)
CFGS = {"l": (128, 128), "s": (64, 64)}  # the dense kernels' GemmL / GemmS: (tokens, weight rows) per tile
SHAPES = {**CFGS, "w": (64, 128), "n": (32, 128)}  # and the grouped experts' GemmMoeW / GemmMoeN
THREADS = {"l": 256, "s": 128, "w": 128, "n": 128}
MOE_CFG = {TILE: ("w", ""), SMALL_TILE: ("n", "_n")}  # pairs per tile -> (configuration, kernel name suffix)


class GemmSegs(Structure):
    """Mirror of kernels/gemm.cu's GemmSegs: up to three matrices, their row tiles numbered across;
    part / counters: a prompt's split-K scratch (0: partial sums added atomically, or no split)."""

    _fields_ = [("w", c_void_p * 3), ("y", c_void_p * 3), ("rows", c_int * 3), ("tile_end", c_int * 3),
                ("part", c_void_p), ("counters", c_void_p)]


# A prompt's split-K scratch in a model's arena (GpuModel.bind hands it to the Launcher): slices x
# tokens x rows floats, and one zeroed counter per tile. Split grids have fewer than 2 x SMs tiles of
# 64 x 64, so 2 x 264 x 4096 floats cover an H100's / H200's worst case; k_splits takes fewer slices
# where a product would not fit.
PART_FLOATS = 1 << 21
PART_COUNTERS = 1024


@lru_cache(maxsize=None)  # (these three are asked per launch: a prompt's host time is per launch, s38)
def stage_weights(type_name: str) -> int:
    """Weights of a row per pipeline stage (GemmRaw<T>::KB)."""
    qk = GGML_TYPES_BY_NAME[type_name].block_size
    return 32 if type_name == "F32" else 64 if qk == 1 else 256 if qk == 256 else 128


@lru_cache(maxsize=None)
def shared_bytes(type_name: str, cfg: str, x_bytes: int = 4) -> int:
    """Dynamic shared memory of a kernel (GemmSmem<T, C, XT>::BYTES): two stages of raw weight rows
    (each the 16-byte chunks covering the stage's bytes) and a ring of NA x tiles of 32 k
    (x_bytes: 4 for f32 rows, 2 for the experts' f16 ones)."""
    t = GGML_TYPES_BY_NAME[type_name]
    kb = stage_weights(type_name)
    sb = kb // t.block_size * t.type_size
    slot = (sb + 15) // 16 * 16 + 16
    bm, bn = SHAPES[cfg]
    na = min(4 if (bm, bn) == (64, 64) else 3, kb // 32 + 1)
    return 2 * bn * slot + na * bm * 32 * x_bytes


def down_col_tiles(n_embd: int) -> int:
    """Column tiles of the grouped down kernel, at most (the fewest weight rows a tile of either
    configuration takes): one completion counter per (token, tile)."""
    return -(-n_embd // min(SHAPES[cfg][1] for cfg, _ in MOE_CFG.values()))


def ok(L, w: Weight) -> bool:
    """These kernels read w: an sm_80+ GPU, the tensor 16-byte aligned (GGUF aligns to 32), its
    shared-memory tiles within the device's limit."""
    return L.tc and w.ptr % 16 == 0 and _most_shared(w.type_name) <= L.max_dyn_shared


@lru_cache(maxsize=None)
def _most_shared(type_name: str) -> int:
    return max(shared_bytes(type_name, c) for c in SHAPES)


def cfg_for(L, n_tok: int, rows: int) -> str:
    """128 x 128 tiles when they fill the GPU at least once, else 64 x 64 (4x the blocks): a
    512-token prompt times a 1024-row matrix is only 32 large tiles on 132 SMs."""
    bm, bn = CFGS["l"]
    return "l" if -(-n_tok // bm) * -(-rows // bn) >= L.dev.sm_count else "s"


MAX_K_SPLITS = 16


def k_splits(L, w: Weight, blocks: int, accumulate: bool, n_tok: int = 0, rows: int = 0) -> tuple[int, int]:
    """(slices of K, split-K scratch or 0) for a grid of `blocks` tiles (gridDim.z) that fills less
    than the GPU twice over, in up to MAX_K_SPLITS slices of whole stages, none empty:
    - a decode step of several sequences (L.decode_rows): an accumulated product only, each slice
      adding into the output atomically (a decode batch's output projection and FFN down);
    - a prompt: any product, where the model gave the Launcher a scratch (L.gemm_part) that holds
      slices x n_tok x rows floats (rows: all segments'), summed in slice order by each tile's last
      slice, so the logits are the same every run (a 128-token prompt's output projection is 32
      tiles on 132 SMs). L.prompt_splits off: prompts keep one slice.
    Large grids keep one."""
    target = 2 * L.dev.sm_count
    if blocks >= target:
        return 1, 0
    stages = -(-w.k // stage_weights(w.type_name))
    if L.decode_rows:
        return (max(1, min(MAX_K_SPLITS, stages, -(-target // blocks))) if accumulate else 1), 0
    if not (L.prompt_splits and L.gemm_part) or blocks > PART_COUNTERS:
        return 1, 0
    z = min(MAX_K_SPLITS, stages, -(-target // blocks), PART_FLOATS // max(1, n_tok * rows))
    if z < 2:
        return 1, 0
    per = -(-stages // z)
    return -(-stages // per), L.gemm_part  # as many slices as `per` stages each make: none empty


def gemm(L, ws: list[Weight], x: int, ys: list[int], n_tok: int, accumulate: bool = False, x_stride: int = 0,
         cfg: str | None = None) -> None:
    """ys[i][t, :] (+)= ws[i] x[t, :] for up to three matrices of one type and row length, one launch."""
    w0 = ws[0]
    assert 1 <= len(ws) <= 3 and all(w.type_name == w0.type_name and w.row_bytes == w0.row_bytes for w in ws)
    x_stride = x_stride or w0.k
    rows = w0.rows if len(ws) == 1 else sum(w.rows for w in ws)
    cfg = cfg or cfg_for(L, n_tok, rows)
    bm, bn = CFGS[cfg]
    ws, ys = tuple(ws), tuple(ys)
    end = _row_tiles(ws, bn)
    m_tiles = -(-n_tok // bm)
    z, part = k_splits(L, w0, end * m_tiles, accumulate, n_tok, rows)
    segs = _segs(ws, ys, bn, part, L.gemm_counters if part else 0)
    L.go(f"reflex_gemm_{w0.suffix}_{cfg}", (end, m_tiles, z), THREADS[cfg],
         [segs, c_long(w0.row_bytes), c_void_p(x), c_int(x_stride), c_int(w0.k), c_int(n_tok),
          c_int(int(accumulate))], shared_bytes(w0.type_name, cfg))


def _row_tiles(ws: tuple, bn: int) -> int:
    """Row tiles of bn rows over all segments."""
    return sum(-(-w.rows // bn) for w in ws)


@lru_cache(maxsize=4096)  # a layer's products take the same segments every prompt (3 us a launch to build)
def _segs(ws: tuple, ys: tuple, bn: int, part: int, counters: int) -> GemmSegs:
    """The launch's GemmSegs, never changed once made (a launch copies its bytes; recorded launches keep it)."""
    segs, end = GemmSegs(), 0
    for i in range(3):
        if i < len(ws):
            segs.w[i], segs.y[i], segs.rows[i] = ws[i].ptr, ys[i], ws[i].rows
            end += -(-ws[i].rows // bn)
        segs.tile_end[i] = end
    segs.part, segs.counters = part, counters
    return segs


def glu(L, wg: Weight, wu: Weight, x: int, out: int, n_tok: int, act: int, x_stride: int = 0,
        cfg: str | None = None) -> None:
    """out[t, :] = act(Wg x[t]) * (Wu x[t]), gate and up in one pass (same type and row length)."""
    assert wg.type_name == wu.type_name and wg.row_bytes == wu.row_bytes and wg.rows == wu.rows
    cfg = cfg or cfg_for(L, n_tok, 2 * wg.rows)
    bm, bn = CFGS[cfg]
    L.go(f"reflex_gemm_glu_{wg.suffix}_{cfg}", (-(-wg.rows // (bn // 2)), -(-n_tok // bm), 1), THREADS[cfg],
         [c_void_p(wg.ptr), c_void_p(wu.ptr), c_long(wg.row_bytes), c_void_p(x), c_int(x_stride or wg.k),
          c_void_p(out), c_int(wg.rows), c_int(wg.k), c_int(n_tok), c_int(act)],
         shared_bytes(wg.type_name, cfg))


def to_half(L, x: int, y: int, n: int) -> None:
    """y[:n] = x[:n] rounded to f16 (n % 8 == 0): the experts' input rows for moe_glu."""
    assert n % 8 == 0
    L.go("reflex_gemm_to_half", (max(1, min(-(-n // 2048), 4 * L.dev.sm_count)), 1, 1), 256,
         [c_void_p(x), c_void_p(y), c_long(n)])


def moe_glu(L, wg: Weight, wu: Weight, expert_bytes: int, n_ff: int, grp: MoeGroups, x: int, out: int,
            act: int) -> None:
    """out[i] = act(gate_e x[tok(i)]) * (up_e x[tok(i)]) for every pair i in expert order; x (from
    to_half) and out in f16."""
    assert wg.type_name == wu.type_name and wg.row_bytes == wu.row_bytes
    cfg, sfx = MOE_CFG[grp.tile]
    L.go(f"reflex_moe_gemm_glu_{wg.suffix}{sfx}", (-(-n_ff // (SHAPES[cfg][1] // 2)), grp.max_tiles, 1), THREADS[cfg],
         [c_void_p(wg.ptr), c_void_p(wu.ptr), c_long(wg.row_bytes), c_long(expert_bytes), c_void_p(grp.counts),
          c_void_p(grp.offsets), c_void_p(grp.tile_e), c_void_p(grp.tile_m0), c_void_p(grp.n_tiles),
          c_void_p(grp.pair_tok), c_void_p(x), c_int(wg.k), c_void_p(out), c_int(n_ff), c_int(wg.k), c_int(act)],
         shared_bytes(wg.type_name, cfg, 2))


def moe_down(L, wd: Weight, expert_bytes: int, n_embd: int, grp: MoeGroups, act: int, weights: int, k: int, ybuf: int,
             x: int, counters: int) -> None:
    """x[t] += sum over t's k slots, in slot order, of weight * down_e act[pair] (act: moe_glu's f16
    rows). ybuf: n_pairs x
    n_embd floats of scratch; counters: n_tok * down_col_tiles(n_embd) zeroed ints, left zeroed."""
    cfg, sfx = MOE_CFG[grp.tile]
    L.go(f"reflex_moe_gemm_down_{wd.suffix}{sfx}", (-(-n_embd // SHAPES[cfg][1]), grp.max_tiles, 1), THREADS[cfg],
         [c_void_p(wd.ptr), c_long(wd.row_bytes), c_long(expert_bytes), c_void_p(grp.counts),
          c_void_p(grp.offsets), c_void_p(grp.tile_e), c_void_p(grp.tile_m0), c_void_p(grp.n_tiles),
          c_void_p(grp.pair_id), c_void_p(act), c_int(wd.k), c_void_p(weights), c_int(k), c_void_p(ybuf),
          c_void_p(x), c_int(n_embd), c_void_p(counters)],
         shared_bytes(wd.type_name, cfg, 2))
