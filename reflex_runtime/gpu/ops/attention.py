"""kernels/attention.cu: attention over the f16 KV cache for any batch (the scalar split-K
kernel: decode with the legacy kernels, and prompts on GPUs without flash_attn.cu)."""

from __future__ import annotations

from ctypes import c_float, c_int, c_void_p

KERNELS = ("reflex_attn",)
SPLITS_DECODE = 16  # slices of the keys for one token (the legacy decode attention)


def attention(L, q, k_cache, v_cache, kv_pos, q_pos, q_slot, seg_lo, prefix_len, n_kv, out, part_o, part_ml, counters,
              n_tok, n_head, n_head_kv, hd, hd_v, n_rows, window, scale, softcap, n_split, blocks: int = 0) -> None:
    """counters: n_tok * n_head zeroed ints (n_split > 1 only); the kernel leaves them zeroed.
    n_rows: cache rows per KV head; blocks: the paged cache's block table (0: slot = row)."""
    L.go("reflex_attn", (n_tok, n_head, n_split), 128,
         [c_void_p(q), c_void_p(k_cache), c_void_p(v_cache), c_void_p(kv_pos), c_void_p(q_pos), c_void_p(q_slot),
          c_void_p(seg_lo or None), c_int(prefix_len), c_void_p(n_kv), c_void_p(out), c_void_p(part_o or None),
          c_void_p(part_ml or None), c_void_p(counters or None), c_int(n_head), c_int(n_head_kv), c_int(hd),
          c_int(hd_v), c_int(n_rows), c_int(window), c_float(scale), c_float(softcap), c_int(n_split),
          c_void_p(blocks or None)])
