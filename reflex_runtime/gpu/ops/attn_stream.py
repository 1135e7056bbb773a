"""kernels/attn_stream.cu: reflex_attn_decode's attention (the same parameters, grid, partials and
counters: ops/attn_decode.py launches it, passing what it needs of the tiled kernel's layout) with
each warp streaming its own keys through a ring of shared-memory slots; chosen by L.attn_stream
(REFLEX_ATTN_STREAM) for the heads it serves."""

from __future__ import annotations

KERNELS = ("reflex_attn_stream",)
GROUP = 8  # keys a warp takes at a time (STR_GROUP)
STAGES = 3  # ring slots per warp (STR_STAGES)
MAX_GROUP = 4  # query heads a block serves (STR_GM)
MAX_HEAD = 128  # hd and hd_v at most (32 * STR_MR)
WARPS = 4


def smem_bytes(group: int, hd: int, hd_v: int, at_least: int = 0) -> int:
    """Dynamic shared memory: each warp's ring, q, the warps' merge; at_least: the tiled kernel's
    layout, which the short path (attn_short.cuh) reuses when it is on."""
    return max(at_least, WARPS * STAGES * GROUP * 2 * (hd + hd_v) + 4 * group * hd + 4 * WARPS * group * (hd_v + 2))


def fits(L, group: int, hd: int, hd_v: int, at_least: int = 0) -> bool:
    """Whether L asks for the kernel and it serves these heads on this device (else reflex_attn_decode):
    a Turing's 64 KB of shared memory a block does not hold 4 heads of 128."""
    return (bool(L.attn_stream) and group <= MAX_GROUP and hd <= MAX_HEAD and hd_v <= MAX_HEAD
            and smem_bytes(group, hd, hd_v, at_least) <= L.dev.max_shared - 8 * 1024)


def splits(L, n_head_kv: int, most: int, smem: int) -> int:
    """The grid's y, at most `most`: the blocks an SM holds (L.attn_stream_blocks_per_sm, the 3 the
    kernel's registers allow, or fewer where the driver says fewer fit) times the SMs, in one wave
    (rounded down, where the tiled kernel's rounds)."""
    per_sm = min(L.attn_stream_blocks_per_sm, max(1, L.dev.kernel(KERNELS[0]).blocks_per_sm(WARPS * 32, smem)))
    return max(1, min(most, int(per_sm * L.dev.sm_count // n_head_kv)))
