"""kernels/attn_decode.cu: one query token's attention, all query heads of a KV head per block,
the context split by its length; optionally with reflex_qk_rope_store's work fused in (AtdRope)."""

from __future__ import annotations

from array import array
from ctypes import Structure, c_float, c_int, c_void_p

KERNELS = ("reflex_attn_decode", "reflex_attn_decode_g2", "reflex_attn_decode_g4", "reflex_attn_decode_t2",
           "reflex_attn_decode_t4", "reflex_attn_decode_t8")
GROUP_KERNELS = ((2, "reflex_attn_decode_g2"), (4, "reflex_attn_decode_g4"))  # (most query heads a KV head, kernel)
TC_KERNELS = ((2, "reflex_attn_decode_t2"), (4, "reflex_attn_decode_t4"), (8, "reflex_attn_decode_t8"))
TC_MAX_DIM = 128  # hd and hd_v the tensor-core kernels hold (ATD_TC_DG groups of 32)
SPLITS_MAX = 128  # most slices per KV head (ATD_MAXSPLIT)
MAX_GROUP = 16  # query heads per KV head it serves (ATD_MAXG)
MERGE_RUN = 16  # slices one block merges (ATD_MERGE)
DEFER_MAX = 8  # most slices a row may leave to the output projection to merge (ATD_DEFER_MAX)
COUNTERS_PER_HEAD = 1 + SPLITS_MAX // MERGE_RUN  # ATD_COUNTERS: the top merge's and one per run


def counters(n_head: int, rows: int = 1) -> int:
    """The zeroed ints reflex_attn_decode's merges count on (rows x KV heads x head groups <= n_head)."""
    return rows * n_head * COUNTERS_PER_HEAD


class AtdRope(Structure):
    """Mirror of kernels/attn_decode_args.cuh's AtdRope: the rope + cache store fused into the
    decode attention (k = None: not fused)."""

    _fields_ = [("k", c_void_p), ("v", c_void_p), ("q_norm", c_void_p), ("k_norm", c_void_p), ("factors", c_void_p),
                ("eps", c_float), ("base", c_float), ("freq_scale", c_float), ("rope_dim", c_int), ("mode", c_int),
                ("theta", c_void_p)]


def rope_theta(base: float, freq_scale: float, rope_dim: int) -> array:
    """AtdRope.theta's table (device doubles): freq_scale * base^(-2i / rope_dim) for i < rope_dim / 2,
    the per-position angles rope.cu computes in the kernel, here once per model."""
    return array("d", (freq_scale * base ** (-2.0 * i / rope_dim) for i in range(rope_dim // 2)))


class AtdArgs(Structure):
    """Mirror of kernels/attn_decode_args.cuh's AtdArgs: reflex_attn_decode's parameters as one value
    (how kernels/fused_step.cu's program holds an attention op)."""

    _fields_ = [("q", c_void_p), ("k_cache", c_void_p), ("v_cache", c_void_p), ("kv_pos", c_void_p),
                ("q_pos", c_void_p), ("q_slot", c_void_p), ("seq_lo", c_void_p), ("n_kv_ptr", c_void_p),
                ("out", c_void_p), ("part_o", c_void_p), ("part_ml", c_void_p), ("counters", c_void_p),
                ("n_head", c_int), ("n_head_kv", c_int), ("hd", c_int), ("hd_v", c_int), ("n_rows", c_int),
                ("window", c_int), ("scale", c_float), ("softcap", c_float), ("min_keys", c_int),
                ("prefetch", c_int), ("window_slots", c_int), ("rope", AtdRope), ("kv_blocks", c_void_p)]


def splits(L, n_head_kv: int, fit: int | None = None) -> int:
    """The grid's y: about L.attn_blocks_per_sm blocks per SM at long contexts, at most the `fit`
    an SM holds (a grid past it runs a second wave: 0.79x at 16,384 tokens of context). Rounded
    down: rounding 49.5 up gave the tensor-core kernels (3 an SM) 400 blocks for 396 places."""
    per_sm = L.attn_blocks_per_sm if fit is None else min(L.attn_blocks_per_sm, max(1, fit))
    return max(1, min(SPLITS_MAX, int(per_sm * L.dev.sm_count / n_head_kv + 1e-6)))


def head_groups(L, group: int) -> int:
    """Blocks that share a KV head's query heads at short contexts (L.attn_head_groups, whole
    divisors of the group only; 1: one block per KV head and slice)."""
    n = max(1, min(L.attn_head_groups, group))
    while group % n:
        n -= 1
    return n


def grid_splits(L, n_head: int, n_head_kv: int, hd: int, hd_v: int, rows: int = 1) -> tuple[int, int]:
    """The launch's (max_split, n_hg): its grid's slices per KV head and head groups, which the
    kernel that merges a deferred row's slices (mvs.MvsMerge) plans with too."""
    group = n_head // n_head_kv
    fit = L.dev.kernel(kernel(L, group, hd, hd_v)).blocks_per_sm(128, smem_bytes(group, hd, hd_v))
    return splits(L, n_head_kv * rows, fit), head_groups(L, group)


def kernel(L, group: int, hd: int = 0, hd_v: int = 0) -> str:
    """The decode attention's kernel for `group` query heads a KV head: with L.attn_tc on an sm_80+
    GPU (L.tc), hd, hd_v <= 128 and a context not under L.attn_tc_from (L.attn_context), the
    narrowest tensor-core instantiation that holds them; else the narrowest tile-loop one (every
    one fits hd_v <= 256), unless L.attn_group_kernels is off."""
    if (L.attn_tc and not L.attn_short and L.tc and 0 < hd <= TC_MAX_DIM and 0 < hd_v <= TC_MAX_DIM
            and tc_scratch_bytes(group, hd, hd_v) <= tile_bytes(hd, hd_v)):
        for most, name in TC_KERNELS:
            if group <= most:
                return name
    if L.attn_group_kernels:
        for most, name in GROUP_KERNELS:
            if group <= most:
                return name
    return KERNELS[0]


def tc_scratch_bytes(group: int, hd: int, hd_v: int) -> int:
    """What the tensor-core kernels keep in the tiles' room (attn_decode.cuh atd_tc_keys): the four
    warps' maxima and sums, their output rows, and each one's copy of q's fragments."""
    return 256 + 16 * group * hd_v + 4 * 1024 * (hd // 32)


def tile_bytes(hd: int, hd_v: int) -> int:
    """The two K and two V tiles of 32 padded rows (the tensor-core kernels' scratch instead)."""
    return 64 * (2 * hd + 64) + 64 * (2 * hd_v + 64)


def smem_bytes(group: int, hd: int, hd_v: int) -> int:
    """Dynamic shared memory of one block (reflex_fused_step gives its attention the same)."""
    return 4 * group * (hd + 32) + tile_bytes(hd, hd_v)


def fits(L, n_head: int, n_head_kv: int, hd: int, hd_v: int) -> bool:
    """Whether the kernel serves these heads (the caller may then fuse the rope into it)."""
    if not L.attn_decode or n_head % n_head_kv or hd % 32 or hd_v % 32 or hd > 256 or hd_v > 256:
        return False
    group = n_head // n_head_kv
    return group <= MAX_GROUP and smem_bytes(group, hd, hd_v) <= L.dev.max_shared - 8 * 1024


def attention(L, q, k_cache, v_cache, kv_pos, q_pos, q_slot, n_kv, out, part_o, part_ml, counters, n_head, n_head_kv,
              hd, hd_v, n_rows, window, scale, softcap, prefetch: bool, window_slots: bool = False,
              rope: AtdRope | None = None, rows: int = 1, seq_lo: int = 0, blocks: int = 0, defer: int = 0) -> bool:
    """One query token per row (see the module doc): rows > 1 is a batch of sequences, row r's
    keys from slot seq_lo[r] (device ints; 0: every row from slot 0). part_o / part_ml hold
    rows * n_head * SPLITS_MAX slices; counters: counters(n_head, rows) zeroed ints. prefetch: the cache rows before the newest were written two
    or more launches back (the decode graph). window_slots: slot j holds position j + c, so a
    sliding window bounds the slots read. rope: q is raw and the new key / value are rope.k /
    rope.v: the kernel normalizes, rotates and stores them. n_rows: cache rows per KV head; blocks:
    the paged cache's block table (0: slot = row). defer (one row, <= DEFER_MAX): a context of 2 ..
    defer slices is left as its partials for the next kernel to merge (mvs.MvsMerge, the output
    projection): `out` is not written then. False: not applicable, nothing launched."""
    if not fits(L, n_head, n_head_kv, hd, hd_v):
        return False
    if rope is not None and (rope.rope_dim > hd or rope.rope_dim % 2):
        return False
    assert rope is None or not rope.k or rope.theta, "a fused rope needs its angle table (rope_theta)"
    assert 0 <= defer <= DEFER_MAX and (rows == 1 or not defer), "a deferred merge is one row's, of at most 8 slices"
    assert n_rows * max(hd, hd_v) < 1 << 31, "a KV head's cache rows past 2^31 elements (32-bit offsets in the kernel)"
    smem = smem_bytes(n_head // n_head_kv, hd, hd_v)
    max_split, n_hg = grid_splits(L, n_head, n_head_kv, hd, hd_v, rows)
    # rows share the GPU: about the same number of blocks in all, so a row of a large batch walks
    # its keys in fewer slices (a 64-row Qwen3-0.6B step spent 2.1 ms in attention with 33 per row)
    L.go(kernel(L, n_head // n_head_kv, hd, hd_v), (n_head_kv * n_hg, max_split, rows), 128,
         [c_void_p(q), c_void_p(k_cache), c_void_p(v_cache), c_void_p(kv_pos), c_void_p(q_pos), c_void_p(q_slot),
          c_void_p(seq_lo or None), c_void_p(n_kv), c_void_p(out), c_void_p(part_o), c_void_p(part_ml), c_void_p(counters), c_int(n_head),
          c_int(n_head_kv), c_int(hd), c_int(hd_v), c_int(n_rows), c_int(window), c_float(scale),
          c_float(softcap), c_int(max(1, L.attn_min_keys)), c_int(int(prefetch)), c_int(int(window_slots)),
          rope if rope is not None else AtdRope(), c_int(n_hg), c_int(defer), c_int(L.attn_tc_min_keys),
          c_void_p(blocks or None)], smem)
    return True
