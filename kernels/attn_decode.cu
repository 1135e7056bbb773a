// attn_decode.cu: attention of one query token (a decode step) over the f16 KV cache. A block
// serves all G = n_head / n_head_kv query heads of one KV head, so K and V are read once per KV
// head, and the context is split across blocks by its length.
//
// Grid (n_head_kv * n_hg, max_split, rows), 128 threads. Each z is one row: the decode token of one
// sequence of a batch (rows > 1: continuous batching), whose keys are the cache slots
// seq_lo[row] .. its slot (seq_lo NULL: from 0); rows share nothing but the weights of the launch.
// n_split = clamp(ceil(n_vis / min_keys), 1, max_split) slices of the n_vis visible keys; blocks
// past n_split leave at once, so a short context runs few blocks and a long one up to max_split per
// KV head. A block walks its slice in tiles of 32 keys:
// cp.async copies the next tile's K and V rows into shared memory while the current one is
// computed; 4 threads per key score it against the G heads, one warp per head folds the tile into
// an online softmax, and each thread accumulates 4 output dimensions of a head. Slices merge in
// two levels: the last block to finish of each run of 16 slices merges the run into its first
// slot, the last run's merger merges the runs (atomic counters, left at zero: ATD_COUNTERS per KV
// head and head group, the top one and one per run).
// With `prefetch` (the decode graph), the first tile's keys older than the newest are copied
// before rx_pdl_begin(): they were written by earlier graph launches, and n_kv / slot / pos by the
// previous step's pick (an earlier launch too), so the rope angles are computed there as well; only
// the newest key, which the predecessor (rope + cache store) writes, is copied after the wait.
// Cache rows go through kv_blocks (the paged cache's table, common.cuh), which only the host
// writes, between launches: it may be read before the wait too.
// With rope.k set (AtdRope), the kernel also does what reflex_qk_rope_store (rope.cu) does for one
// token, so the decode step needs no launch for it: every block normalizes (per-head RMSNorm,
// optional) and rotates its G query heads from the raw projections; the block of the last slice
// does the same for the new key, writes it and the new value to cache slot `slot` as f16 (and
// kv_pos[slot] = pos, KV head 0), and uses them as the newest key. Rotation as in rope.cu: NeoX
// pairs (i, i + rope_dim/2) or, with mode 1, pairwise (2i, 2i + 1); angle_i = pos * freq_scale *
// base^(-2i/rope_dim) / factors[i] (factors optional), in double from the host's table rope.theta
// (attn_decode.py rope_theta), reduced to [-pi, pi] before a float sincos; dims from rope_dim pass through.
// Visible keys: seq_lo[row] <= j < n_vis = min(n_kv, slot + 1), and pos - kv_pos[j] < window when window > 0.
// With `window_slots` (the caller's promise that slot j holds position j + c, as in generate), a
// sliding window also bounds the slots walked: only the last `window` slots can be visible, so a
// local layer reads window keys, not the whole context (the per-key test still applies).
// n_hg > 1 (x = KV head * n_hg + group): at a short context, while n_split * n_hg <= max_split,
// the G query heads are shared by n_hg blocks of G / n_hg heads each, over the same keys (the few
// KV heads of a big GQA model would otherwise run a handful of blocks, each through all G heads);
// past that group 0 of each KV head takes all G heads. Counters: rows * n_head_kv * n_hg * ATD_COUNTERS.
// tc_min (the tensor-core kernels _t2 / _t4 / _t8 only): a block whose slice holds at least that many keys
// walks them on tensor cores, each warp its own (attn_decode.cuh atd_tc_keys), a shorter one through the tiles;
// a parameter before kv_blocks, which stays last as in every kernel that reads the caches.
// Output rows and partials as reflex_attn (attention.cu) with n_split = gridDim.y. defer (<= ATD_DEFER_MAX, one
// row): a launch of 2 .. defer slices writes only its partials; the next kernel merges them (mvs.cuh MvsMerge).
// Dynamic smem: 4 G (hd + 32) + 2 * 32 * (2 hd + 64) + 2 * 32 * (2 hd_v + 64) bytes.
// Requirements (host-checked): hd and hd_v multiples of 32 up to 256, G <= 16, gridDim.y <= 128.
// Bound by reading K and V once per KV head: n_vis * (hd + hd_v) * 2 bytes.
#include "attn_decode.cuh"

// reflex_attn_decode serves any group (G <= 16); _g2 and _g4 the same work for G <= 2 and G <= 4 with
// registers for that many heads and items only (their own kernels: registers are per kernel); _t2,
// _t4 and _t8 walk the keys on tensor cores, a warp each its own (TC).
#define RX_ATTN_DECODE(suffix, MG, NI, TC, BOUNDS)                                                                   \
    extern "C" __global__ void __launch_bounds__ BOUNDS reflex_attn_decode##suffix(                                  \
        const float* q, half* k_cache, half* v_cache, int* kv_pos, const int* q_pos, const int* q_slot,              \
        const int* seq_lo, const int* n_kv_ptr, float* out, float* part_o, float* part_ml, int* counters,            \
        int n_head, int n_head_kv, int hd, int hd_v, int n_rows, int window, float scale, float softcap,             \
        int min_keys, int prefetch, int window_slots, AtdRope rope, int n_hg, int defer, int tc_min,                 \
        const int* kv_blocks) {                                                                                      \
        rx_pdl_weights_first(); /* early reads: cache rows of earlier launches, norm weights (the header) */         \
        AtdArgs a{q, k_cache, v_cache, kv_pos, q_pos, q_slot, seq_lo, n_kv_ptr, out, part_o, part_ml,                \
                  counters, n_head, n_head_kv, hd, hd_v, n_rows, window, scale, softcap, min_keys,                   \
                  prefetch, window_slots, rope, kv_blocks};                                                          \
        atd_body<AtdPdlWait, MG, NI, TC>(a, rx_dyn_smem, blockIdx.x / n_hg, blockIdx.y, gridDim.y, blockIdx.z,       \
                                         blockIdx.x % n_hg, n_hg, AtdPdlWait(), defer, tc_min);                      \
    }
RX_ATTN_DECODE(, ATD_MAXG, ATD_ITEMS, false, (ATD_THREADS))
RX_ATTN_DECODE(_g2, 2, 1, false, (ATD_THREADS))  // G * hd_v / 4 <= 2 * 256 / 4: one item a thread
RX_ATTN_DECODE(_g4, 4, 2, false, (ATD_THREADS))
// the tensor-core kernels (attn_decode.cuh atd_tc_keys): G <= 2 / 4 / 8, hd and hd_v <= 128, sm_80+; three
// blocks an SM (163-167 registers, none spilled; 191 unbounded: two). A bound of one block an SM is not the same
// as none: it moved the tile kernels' registers (g2 95 -> 102, which fits four blocks, not five)
RX_ATTN_DECODE(_t2, 2, 1, true, (ATD_THREADS, 3))
RX_ATTN_DECODE(_t4, 4, 1, true, (ATD_THREADS, 3))
RX_ATTN_DECODE(_t8, 8, 2, true, (ATD_THREADS, 3))
