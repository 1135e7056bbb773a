"""kernels/mla_flash.cu: DeepSeek's latent attention for >= 2 query tokens on tensor cores (sm_80+),
the absorbed form over latent rows of kv_lora_rank 512 + rope 64 (DeepSeek-V2, V2-Lite, V3)."""

from __future__ import annotations

from ctypes import c_float, c_int, c_void_p

KERNELS = ("reflex_mla_flash",)
ROWS = 32  # query rows (token, head) per block (MLF_ROWS)
BKV = 64  # keys per tile (MLF_BKV)
D, R = 576, 512  # key and value widths (MLF_D, MLF_R)
THREADS = 256


def shared_bytes() -> int:
    """Dynamic shared memory (MLF_BYTES): the Q rows, two key tiles, P."""
    return ((ROWS + 2 * BKV) * (D + 8) + ROWS * (BKV + 8)) * 2


def ok(L, n_tok: int, r: int, d: int, rows: bool) -> bool:
    """Whether a batch's latent attention runs here: a prompt chunk or a system1 tree (not decode,
    not continuous batching's rows, whose keys split across blocks in mla.cu), of the only width."""
    return (L.tc and L.mla_flash and n_tok >= 2 and not rows and r == R and d == D
            and shared_bytes() <= L.max_dyn_shared)


def attention(L, q, cache, q_slot, seg_lo, prefix_len, n_kv, out, n_tok, n_head, scale, blocks: int = 0) -> None:
    """mla.attention's result (one slice) for n_tok tokens: q (n_tok, n_head, 576) floats, out
    (n_tok, n_head, 512). blocks: the paged cache's block table (0: slot = row)."""
    n_rows = n_tok * n_head
    L.go("reflex_mla_flash", (-(-n_rows // ROWS), 1, 1), THREADS,
         [c_void_p(q), c_void_p(cache), c_void_p(q_slot), c_void_p(seg_lo or None), c_int(prefix_len),
          c_void_p(n_kv), c_void_p(out), c_int(n_rows), c_int(n_head), c_float(scale), c_void_p(blocks or None)],
         shared_bytes())
