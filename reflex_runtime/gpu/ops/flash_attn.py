"""kernels/flash_attn.cu: attention of a batch of >= 2 query tokens on tensor cores (sm_80+,
mma.sync with cp.async), head sizes 64 / 128 / 256."""

from __future__ import annotations

from ctypes import c_float, c_int, c_void_p

HEAD_DIMS = (64, 128, 256)  # instantiations (head_dim == head_dim_v)
KERNELS = tuple(f"reflex_flash_attn_{hd}" for hd in HEAD_DIMS)
ROWS = 64  # query rows (token, head) per block
MIN_TOKENS = 2  # one token (decode) keeps the split-K kernels


def shared_bytes(hd: int) -> int:
    """Dynamic shared memory of reflex_flash_attn_<hd> (FaCfg<HD>::BYTES): Q, one K and one V tile."""
    bkv = 32 if hd >= 256 else 64
    return (ROWS + 2 * bkv) * (hd + 8) * 2


def ok(L, n_tok: int, hd: int, hd_v: int, n_head: int, n_head_kv: int) -> bool:
    """Whether a batch's attention runs here (else attention.cu)."""
    return (L.tc and n_tok >= MIN_TOKENS and hd == hd_v and hd in HEAD_DIMS
            and n_head // n_head_kv <= ROWS and shared_bytes(hd) <= L.max_dyn_shared)


def attention(L, q, k_cache, v_cache, kv_pos, q_pos, q_slot, seg_lo, prefix_len, n_kv, out, n_tok, n_head, n_head_kv,
              hd, n_rows, window, scale, softcap, blocks: int = 0) -> None:
    """attention.cu's result for n_tok query tokens on tensor cores (see ok)."""
    bt = ROWS // (n_head // n_head_kv)  # tokens per block
    L.go(f"reflex_flash_attn_{hd}", (-(-n_tok // bt), n_head_kv, 1), 128,
         [c_void_p(q), c_void_p(k_cache), c_void_p(v_cache), c_void_p(kv_pos), c_void_p(q_pos), c_void_p(q_slot),
          c_void_p(seg_lo or None), c_int(prefix_len), c_void_p(n_kv), c_void_p(out), c_int(n_tok), c_int(n_head),
          c_int(n_head_kv), c_int(n_rows), c_int(window), c_float(scale), c_float(softcap), c_void_p(blocks or None)],
         shared_bytes(hd))
