"""kernels/mla.cu: multi-head latent attention (DeepSeek-V2/V3) over the latent cache: RoPE + the
cache store, per-head products (W_k^T absorb, W_v up; the transposed form for the legacy
attn_kv_b layout), and attention over the latent rows, 8 heads per block."""

from __future__ import annotations

from ctypes import Structure, c_double, c_float, c_int, c_long, c_void_p

from .common import Weight, per_type
from .matvec import warps_per_row

KERNELS = per_type("reflex_mla_mv_{}", "reflex_mla_mm_{}", "reflex_mla_mv_t_{}") + (
    "reflex_mla_rope_store", "reflex_mla_attn")
HEADS = 8  # query heads per attention block
SPLITS_DECODE = 128  # key slices of a decode step (<= MERGE_RUN * 32: split_merge_done's runs fit a warp)
MERGE_RUN = 16  # slices one block merges (MLA_RUN)


def counters(n_tok: int, n_head: int) -> int:
    """The zeroed ints reflex_mla_attn's merges count on: MLA_COUNTERS per (token, head group)."""
    return n_tok * -(-n_head // HEADS) * (1 + SPLITS_DECODE // MERGE_RUN)
MAX_PAIRS = 64  # rope pairs in the frequency table


class MlaRope(Structure):
    """Mirror of kernels/mla.cu's MlaRope: per-pair rotation frequencies (radians per position)."""

    _fields_ = [("freq", c_double * MAX_PAIRS)]

    @classmethod
    def of(cls, freqs) -> "MlaRope":
        assert len(freqs) <= MAX_PAIRS
        tab = cls()
        for i, f in enumerate(freqs):
            tab.freq[i] = f
        return tab


def rope_store(L, q, qm, kv, kv_norm, pos, slot, cache, tab: MlaRope, attn_factor, n_tok, n_head, nope, rope, r,
               eps, blocks: int = 0) -> None:
    """blocks: the paged cache's block table (0: slot = row)."""
    L.go("reflex_mla_rope_store", (n_tok, n_head + 1, 1), 128,
         [c_void_p(q), c_void_p(qm), c_void_p(kv), c_void_p(kv_norm), c_void_p(pos), c_void_p(slot),
          c_void_p(cache), tab, c_float(attn_factor), c_int(n_head), c_int(nope), c_int(rope), c_int(r),
          c_float(eps), c_void_p(blocks or None)])


def heads(L, w: Weight, head_bytes: int, x: int, x_tok: int, x_head: int, y: int, y_tok: int, y_head: int, n_tok: int,
          n_head: int, tensor_cores: bool = False) -> None:
    """y[t, h] = W_h x[t, h] for every head h (W_h: w.rows rows of w.k at w.ptr + h * head_bytes);
    x and y are strided float rows (tokens, heads). tensor_cores: the WMMA kernel (large
    batches), which needs K % 64 == 0."""
    args = [c_void_p(w.ptr), c_long(w.row_bytes), c_long(head_bytes), c_void_p(x), c_int(x_tok), c_int(x_head),
            c_void_p(y), c_int(y_tok), c_int(y_head), c_int(w.rows), c_int(w.k), c_int(n_tok)]
    if tensor_cores and w.k % 64 == 0:
        L.go(f"reflex_mla_mm_{w.suffix}", ((w.rows + 127) // 128, (n_tok + 63) // 64, n_head), 256, args)
        return
    wpr = warps_per_row(L, w.rows * n_head, w.k)
    per_block = 8 // wpr
    L.go(f"reflex_mla_mv_{w.suffix}", ((w.rows + per_block - 1) // per_block, n_head, 1), 256, args + [c_int(wpr)])


def heads_t(L, w: Weight, head_bytes: int, x: int, x_tok: int, x_head: int, y: int, y_tok: int, y_head: int, n_tok: int,
            n_head: int) -> None:
    """y[t, h] = W_h^T x[t, h]: W_h is w.rows rows of w.k (<= 2048), y rows of w.k floats."""
    assert w.k <= 2048
    L.go(f"reflex_mla_mv_t_{w.suffix}", (n_head, (n_tok + 3) // 4, 1), 256,
         [c_void_p(w.ptr), c_long(w.row_bytes), c_long(head_bytes), c_void_p(x), c_int(x_tok), c_int(x_head),
          c_void_p(y), c_int(y_tok), c_int(y_head), c_int(w.rows), c_int(w.k), c_int(n_tok)])


def attention(L, q, cache, q_slot, seg_lo, prefix_len, n_kv, out, part_o, part_ml, counters, n_tok, n_head, r, d, scale,
              n_split, blocks: int = 0) -> None:
    """counters: counters(n_tok, n_head) zeroed ints (n_split > 1 only); left zeroed.
    blocks: the paged cache's block table (0: slot = row)."""
    groups = (n_head + HEADS - 1) // HEADS
    L.go("reflex_mla_attn", (n_tok, n_split, groups), 256,
         [c_void_p(q), c_void_p(cache), c_void_p(q_slot), c_void_p(seg_lo or None), c_int(prefix_len),
          c_void_p(n_kv), c_void_p(out), c_void_p(part_o or None), c_void_p(part_ml or None),
          c_void_p(counters or None), c_int(n_head), c_int(r), c_int(d), c_float(scale), c_int(n_split),
          c_void_p(blocks or None)])
