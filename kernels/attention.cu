// attention.cu: softmax(q k^T * scale) v over the f16 KV cache, for any batch of query tokens
// (prefill, decode, and system1's tree of candidates), with GQA, optional sliding window and
// logit soft-capping.
//
// Which cache slots a query at slot s may see: j <= s, and (j < prefix_len or j >= seg_lo[t]),
// and (window <= 0 or pos[t] - kv_pos[j] < window). Plain causal attention passes seg_lo = NULL.
// A system1 candidate token sees the whole prompt (j < prefix_len) and its own earlier tokens
// (j >= seg_lo[t], the slot where its candidate starts).
//
// Grid (n_tok, n_head, n_split); 128 threads = 4 warps. Each block takes one query head and one
// of n_split slices of the visible keys; each warp streams keys with an online softmax, the
// warps merge in shared memory, and the block writes either the final row (n_split == 1) or an
// unnormalized partial; the last block of a row to finish (an atomic counter per row, reset
// for the next graph replay) merges the partials, so a decode step needs one launch.
// Bound by reading K and V once per (query token, head): 2 * n_kv * head_dim * 2 bytes.
// head_dim <= 256, hd_v % 32 == 0.
#include "attention.cuh"

#define ATT_WARPS 4
#define ATT_MAXV 8  // hd_v / 32
#define ATT_MIN_KEYS 1  // fewer slices only when there are fewer keys than slices (64 measured slower)

extern "C" __global__ void __launch_bounds__(128) reflex_attn(
    const float* q, const half* k_cache, const half* v_cache, const int* kv_pos, const int* q_pos, const int* q_slot,
    const int* seg_lo, int prefix_len, const int* n_kv_ptr, float* out, float* part_o, float* part_ml, int* counters,
    int n_head,
    int n_head_kv, int hd, int hd_v, int n_rows, int window, float scale, float softcap, int n_split, const int* kv_blocks) {
    rx_pdl_begin();
    __shared__ float qs[256];
    __shared__ float wm[ATT_WARPS], wl[ATT_WARPS];
    __shared__ float wacc[ATT_WARPS][256];
    int t = blockIdx.x, h = blockIdx.y, split = blockIdx.z;
    // partials sit n_split (the launch's) slices apart per row: rows of a batch of sequences
    // shrink their own n_split below to their keys, and must not share slices
    const int stride = n_split;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int kvh = h / (n_head / n_head_kv);
    int my_slot = q_slot[t], my_pos = q_pos[t];
    int lo = seg_lo ? seg_lo[t] : 0;
    int n_vis = min(*n_kv_ptr, my_slot + 1);
    // A context shorter than n_split keys uses fewer slices (no empty ones to merge). Every block
    // of the row computes the same count from the same n_kv; surplus blocks leave before any
    // barrier. Larger minimum slices (64 keys) made decode slower on the H200: one warp walking
    // more keys costs more than the merge saves.
    n_split = min(n_split, max(1, (n_vis - (prefix_len > 0 ? 0 : min(lo, n_vis)) + ATT_MIN_KEYS - 1) / ATT_MIN_KEYS));
    if (split >= n_split) return;
    // Without a shared prefix nothing before seg_lo is visible: start there (a batch of sequences'
    // decode rows, each in its own range of the cache).
    int start = prefix_len > 0 ? 0 : min(lo, n_vis);
    int chunk = (n_vis - start + n_split - 1) / n_split;
    int j0 = start + split * chunk, j1 = min(n_vis, j0 + chunk);

    const float* qh = q + ((long)t * n_head + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = qh[d] * scale;
    __syncthreads();

    const half* kbase = k_cache + (long)kvh * n_rows * hd;
    const half* vbase = v_cache + (long)kvh * n_rows * hd_v;
    float m = -INFINITY, l = 0.f;
    float acc[ATT_MAXV];
#pragma unroll
    for (int i = 0; i < ATT_MAXV; i++) acc[i] = 0.f;
    int nv = hd_v / 32;

    for (int j = j0 + warp; j < j1; j += ATT_WARPS) {
        if (!(j < prefix_len || j >= lo)) continue;
        if (window > 0 && my_pos - kv_pos[j] >= window) continue;
        long row_j = rx_kv_row(kv_blocks, j);
        const half* kj = kbase + row_j * hd;
        float s = 0.f;
        for (int d = lane; d < hd; d += 32) s += qs[d] * __half2float(kj[d]);
        s = warp_sum(s);
        if (softcap > 0.f) s = softcap * tanhf(s / softcap);
        float m_new = fmaxf(m, s);
        float corr = __expf(m - m_new), p = __expf(s - m_new);
        l = l * corr + p;
        const half* vj = vbase + row_j * hd_v;
#pragma unroll
        for (int i = 0; i < ATT_MAXV; i++)
            if (i < nv) acc[i] = acc[i] * corr + p * __half2float(vj[lane + 32 * i]);
        m = m_new;
    }
    // Merge the warps: rescale each to the block maximum.
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
    __syncthreads();
    float bm = -INFINITY;
    for (int w = 0; w < ATT_WARPS; w++) bm = fmaxf(bm, wm[w]);
    float f = (m == -INFINITY) ? 0.f : __expf(m - bm);
#pragma unroll
    for (int i = 0; i < ATT_MAXV; i++)
        if (i < nv) wacc[warp][lane + 32 * i] = acc[i] * f;
    __syncthreads();
    float bl = 0.f;
    for (int w = 0; w < ATT_WARPS; w++) bl += (wm[w] == -INFINITY) ? 0.f : wl[w] * __expf(wm[w] - bm);
    long row = (long)t * n_head + h;
    for (int d = threadIdx.x; d < hd_v; d += blockDim.x) {
        float o = 0.f;
        for (int w = 0; w < ATT_WARPS; w++) o += wacc[w][d];
        if (n_split == 1) out[row * hd_v + d] = bl > 0.f ? o / bl : 0.f;
        else part_o[(row * stride + split) * hd_v + d] = o;
    }
    if (n_split == 1) return;
    if (threadIdx.x == 0) {
        part_ml[(row * stride + split) * 2] = bm;
        part_ml[(row * stride + split) * 2 + 1] = bl;
    }
    __threadfence();  // our partial is visible before we count ourselves done
    __syncthreads();
    __shared__ int is_last;
    if (threadIdx.x == 0) is_last = atomicAdd(&counters[row], 1) == n_split - 1;
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    attn_merge(part_o, part_ml, out, row, hd_v, n_split, stride);
    if (threadIdx.x == 0) counters[row] = 0;  // ready for the next replay
}

