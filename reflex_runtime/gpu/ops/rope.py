"""kernels/rope.cu: per-head q/k RMS norms, RoPE and the f16 KV cache store, one launch."""

from __future__ import annotations

from ctypes import c_float, c_int, c_void_p

KERNELS = ("reflex_qk_rope_store",)
WARPS, MAX_HD = 8, 256  # rope.cu's ROPE_WARPS (a warp per head at a time) and ROPE_MAX_HD


def heads_per_block(L, n_tok: int, n_heads: int) -> int:
    """Heads a block takes: a whole token's once the tokens alone make about four blocks an SM,
    else fewer (at least one a warp), so that a short batch still has blocks on most SMs."""
    groups = min(-(-n_heads // WARPS), max(1, -(-4 * L.dev.sm_count // n_tok)))
    return -(-n_heads // groups)


def qk_rope_store(L, q, k, v, q_norm, k_norm, pos, slot, kv_pos, k_cache, v_cache, n_tok, n_head, n_head_kv, hd, hd_v,
                  rope_dim, base, freq_scale, eps, n_rows, freq_factors: int = 0, pairwise: bool = False,
                  blocks: int = 0) -> None:
    """Per-head q/k norms (when given), RoPE and the k/v cache store. pairwise: rotate adjacent
    dims (2i, 2i+1) (llama.cpp's normal rope) instead of NeoX halves (i, i + rope_dim/2);
    freq_factors: device pointer to rope_dim/2 floats dividing each pair's frequency (0: none).
    n_rows: cache rows per KV head; blocks: the paged cache's block table (0: slot = row)."""
    assert rope_dim <= hd <= MAX_HD, f"head size {hd} past rope.cu's {MAX_HD}"
    hpb = heads_per_block(L, n_tok, n_head + n_head_kv)
    L.go("reflex_qk_rope_store", (n_tok, -(-(n_head + n_head_kv) // hpb), 1), 32 * WARPS,
         [c_void_p(q), c_void_p(k), c_void_p(v), c_void_p(q_norm or None), c_void_p(k_norm or None), c_void_p(pos),
          c_void_p(slot), c_void_p(kv_pos), c_void_p(k_cache), c_void_p(v_cache), c_int(n_head), c_int(n_head_kv),
          c_int(hd), c_int(hd_v), c_int(rope_dim), c_float(base), c_float(freq_scale),
          c_void_p(freq_factors or None), c_int(int(pairwise)), c_float(eps), c_int(n_rows), c_int(hpb),
          c_void_p(blocks or None)])
