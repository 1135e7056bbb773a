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
#include "common.cuh"

#define ATT_WARPS 4
#define ATT_MAXV 8  // hd_v / 32
#define ATT_MIN_KEYS 1  // fewer slices only when there are fewer keys than slices (64 measured slower)

// Merge the n_split partials of one (token, head) row. Reads bypass L1 (other blocks wrote them).
__device__ void attn_merge(const float* part_o, const float* part_ml, float* out, long row, int hd_v, int n_split) {
    const float* ml = part_ml + row * n_split * 2;
    float gm = -INFINITY;
    for (int s = 0; s < n_split; s++) gm = fmaxf(gm, __ldcg(ml + 2 * s));
    float denom = 0.f;
    for (int s = 0; s < n_split; s++) {
        float m = __ldcg(ml + 2 * s);
        if (m != -INFINITY) denom += __ldcg(ml + 2 * s + 1) * __expf(m - gm);
    }
    for (int d = threadIdx.x; d < hd_v; d += blockDim.x) {
        float o = 0.f;
        for (int s = 0; s < n_split; s++) {
            float m = __ldcg(ml + 2 * s);
            if (m != -INFINITY) o += __ldcg(part_o + (row * n_split + s) * hd_v + d) * __expf(m - gm);
        }
        out[row * hd_v + d] = denom > 0.f ? o / denom : 0.f;
    }
}

extern "C" __global__ void __launch_bounds__(128) reflex_attn(
    const float* q, const half* k_cache, const half* v_cache, const int* kv_pos, const int* q_pos, const int* q_slot,
    const int* seg_lo, int prefix_len, const int* n_kv_ptr, float* out, float* part_o, float* part_ml, int* counters,
    int n_head,
    int n_head_kv, int hd, int hd_v, int n_ctx, int window, float scale, float softcap, int n_split) {
    rx_pdl_begin();
    __shared__ float qs[256];
    __shared__ float wm[ATT_WARPS], wl[ATT_WARPS];
    __shared__ float wacc[ATT_WARPS][256];
    int t = blockIdx.x, h = blockIdx.y, split = blockIdx.z;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int kvh = h / (n_head / n_head_kv);
    int my_slot = q_slot[t], my_pos = q_pos[t];
    int lo = seg_lo ? seg_lo[t] : 0;
    int n_vis = min(*n_kv_ptr, my_slot + 1);
    // A context shorter than n_split keys uses fewer slices (no empty ones to merge). Every block
    // of the row computes the same count from the same n_kv; surplus blocks leave before any
    // barrier. Larger minimum slices (64 keys) made decode slower on the H200: one warp walking
    // more keys costs more than the merge saves.
    n_split = min(n_split, max(1, (n_vis + ATT_MIN_KEYS - 1) / ATT_MIN_KEYS));
    if (split >= n_split) return;
    int chunk = (n_vis + n_split - 1) / n_split;
    int j0 = split * chunk, j1 = min(n_vis, j0 + chunk);

    const float* qh = q + ((long)t * n_head + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = qh[d] * scale;
    __syncthreads();

    const half* kbase = k_cache + (long)kvh * n_ctx * hd;
    const half* vbase = v_cache + (long)kvh * n_ctx * hd_v;
    float m = -INFINITY, l = 0.f;
    float acc[ATT_MAXV];
#pragma unroll
    for (int i = 0; i < ATT_MAXV; i++) acc[i] = 0.f;
    int nv = hd_v / 32;

    for (int j = j0 + warp; j < j1; j += ATT_WARPS) {
        if (!(j < prefix_len || j >= lo)) continue;
        if (window > 0 && my_pos - kv_pos[j] >= window) continue;
        const half* kj = kbase + (long)j * hd;
        float s = 0.f;
        for (int d = lane; d < hd; d += 32) s += qs[d] * __half2float(kj[d]);
        s = warp_sum(s);
        if (softcap > 0.f) s = softcap * tanhf(s / softcap);
        float m_new = fmaxf(m, s);
        float corr = __expf(m - m_new), p = __expf(s - m_new);
        l = l * corr + p;
        const half* vj = vbase + (long)j * hd_v;
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
        else part_o[(row * n_split + split) * hd_v + d] = o;
    }
    if (n_split == 1) return;
    if (threadIdx.x == 0) {
        part_ml[(row * n_split + split) * 2] = bm;
        part_ml[(row * n_split + split) * 2 + 1] = bl;
    }
    __threadfence();  // our partial is visible before we count ourselves done
    __syncthreads();
    __shared__ int is_last;
    if (threadIdx.x == 0) is_last = atomicAdd(&counters[row], 1) == n_split - 1;
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    attn_merge(part_o, part_ml, out, row, hd_v, n_split);
    if (threadIdx.x == 0) counters[row] = 0;  // ready for the next replay
}

// reflex_attn_decode: one query token (a decode step), one block per (KV head, key slice)
// serving all G = n_head / n_head_kv query heads of that KV head, so K and V are read once per
// KV head rather than once per query head. Each warp takes 32 keys at a time, one key per lane:
// a lane computes its key's G scores from one pass over the K row (16-byte loads), the warp
// updates an online softmax per head, then accumulates the 32 V rows with every lane owning
// hd_v / 32 dimensions (coalesced rows). Slices of >= ATT_DEC_KEYS keys (at most gridDim.y)
// are merged by the last block to finish, as in reflex_attn. Causal by n_kv; optional window
// and soft-capping. Requires hd % 8 == 0, hd_v % 32 == 0, G <= 8, G * max(hd, hd_v) <= 1024.
#define ATT_DEC_KEYS 64
#define ATT_MAXG 8

extern "C" __global__ void __launch_bounds__(128, 2) reflex_attn_decode(
    const float* q, const half* k_cache, const half* v_cache, const int* kv_pos, const int* q_pos,
    const int* n_kv_ptr, float* out, float* part_o, float* part_ml, int* counters, int n_head, int n_head_kv, int hd,
    int hd_v, int n_ctx, int window, float scale, float softcap) {
    rx_pdl_begin();
    __shared__ float qs[1024];                  // G x hd, pre-scaled
    __shared__ float wm[ATT_WARPS][ATT_MAXG], wl[ATT_WARPS][ATT_MAXG];
    __shared__ float wacc[ATT_WARPS][1024];     // G x hd_v per warp
    __shared__ int is_last;
    int kvh = blockIdx.x, split = blockIdx.y;
    int G = n_head / n_head_kv;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int n_vis = *n_kv_ptr, my_pos = *q_pos;
    int n_split = min((int)gridDim.y, max(1, (n_vis + ATT_DEC_KEYS - 1) / ATT_DEC_KEYS));
    if (split >= n_split) return;  // every block computes the same n_split before any barrier
    int chunk = (n_vis + n_split - 1) / n_split;
    int j0 = split * chunk, j1 = min(n_vis, j0 + chunk);

    for (int i = threadIdx.x; i < G * hd; i += blockDim.x) qs[i] = q[(long)kvh * G * hd + i] * scale;
    __syncthreads();
    const half* kbase = k_cache + (long)kvh * n_ctx * hd;
    const half* vbase = v_cache + (long)kvh * n_ctx * hd_v;
    int nv = hd_v / 32;
    float m[ATT_MAXG], l[ATT_MAXG], acc[ATT_MAXG][ATT_MAXV];
#pragma unroll
    for (int g = 0; g < ATT_MAXG; g++) {
        m[g] = -INFINITY, l[g] = 0.f;
#pragma unroll
        for (int i = 0; i < ATT_MAXV; i++) acc[g][i] = 0.f;
    }
    // The slice's keys split evenly over the warps (16 each for a 64-key slice: fewer dependent
    // round trips to memory per warp), 32 at a time.
    int per_warp = (j1 - j0 + ATT_WARPS - 1) / ATT_WARPS;
    int wj0 = j0 + warp * per_warp, wj1 = min(j1, wj0 + per_warp);
    for (int base = wj0; base < wj1; base += 32) {
        int j = base + lane;
        bool ok = j < wj1 && !(window > 0 && my_pos - kv_pos[j] >= window);
        float s[ATT_MAXG];
#pragma unroll
        for (int g = 0; g < ATT_MAXG; g++) s[g] = 0.f;
        if (ok) {
            const uint4* kr = reinterpret_cast<const uint4*>(kbase + (long)j * hd);
#pragma unroll 8
            for (int d8 = 0; d8 < hd / 8; d8++) {  // unrolled: 8 loads in flight per lane
                uint4 raw = kr[d8];
                const half2* h2 = reinterpret_cast<const half2*>(&raw);
                float kf[8];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float2 f = __half22float2(h2[i]);
                    kf[2 * i] = f.x, kf[2 * i + 1] = f.y;
                }
#pragma unroll
                for (int g = 0; g < ATT_MAXG; g++)
                    if (g < G) {
                        const float* qg = qs + g * hd + 8 * d8;
#pragma unroll
                        for (int i = 0; i < 8; i++) s[g] += qg[i] * kf[i];
                    }
            }
        }
        float p[ATT_MAXG];
#pragma unroll
        for (int g = 0; g < ATT_MAXG; g++) {
            p[g] = 0.f;
            if (g >= G) continue;
            float sg = s[g];
            if (softcap > 0.f) sg = softcap * tanhf(sg / softcap);
            sg = ok ? sg : -INFINITY;
            float m_new = fmaxf(m[g], warp_max(sg));
            float corr = (m_new == -INFINITY) ? 1.f : __expf(m[g] - m_new);
            p[g] = ok ? __expf(sg - m_new) : 0.f;
            l[g] = l[g] * corr + warp_sum(p[g]);
#pragma unroll
            for (int i = 0; i < ATT_MAXV; i++) acc[g][i] *= corr;
            m[g] = m_new;
        }
        int n_here = min(32, wj1 - base);
#pragma unroll 8
        for (int jj = 0; jj < n_here; jj++) {
            const half* vj = vbase + (long)(base + jj) * hd_v;
            float vv[ATT_MAXV];
#pragma unroll
            for (int i = 0; i < ATT_MAXV; i++) vv[i] = i < nv ? __half2float(vj[lane + 32 * i]) : 0.f;
#pragma unroll
            for (int g = 0; g < ATT_MAXG; g++) {
                if (g >= G) continue;
                float pj = __shfl_sync(0xffffffffu, p[g], jj);
#pragma unroll
                for (int i = 0; i < ATT_MAXV; i++) acc[g][i] += pj * vv[i];
            }
        }
    }
    // Merge the warps per head, rescaled to the block maximum.
#pragma unroll
    for (int g = 0; g < ATT_MAXG; g++)
        if (g < G && lane == 0) wm[warp][g] = m[g], wl[warp][g] = l[g];
    __syncthreads();
#pragma unroll
    for (int g = 0; g < ATT_MAXG; g++) {
        if (g >= G) continue;
        float bm = -INFINITY;
        for (int w = 0; w < ATT_WARPS; w++) bm = fmaxf(bm, wm[w][g]);
        float f = (m[g] == -INFINITY) ? 0.f : __expf(m[g] - bm);
#pragma unroll
        for (int i = 0; i < ATT_MAXV; i++)
            if (i < nv) wacc[warp][g * hd_v + lane + 32 * i] = acc[g][i] * f;
    }
    __syncthreads();
    for (int g = 0; g < G; g++) {
        float bm = -INFINITY, bl = 0.f;
        for (int w = 0; w < ATT_WARPS; w++) bm = fmaxf(bm, wm[w][g]);
        for (int w = 0; w < ATT_WARPS; w++) bl += (wm[w][g] == -INFINITY) ? 0.f : wl[w][g] * __expf(wm[w][g] - bm);
        long row = (long)kvh * G + g;
        for (int d = threadIdx.x; d < hd_v; d += blockDim.x) {
            float o = 0.f;
            for (int w = 0; w < ATT_WARPS; w++) o += wacc[w][g * hd_v + d];
            if (n_split == 1) out[row * hd_v + d] = bl > 0.f ? o / bl : 0.f;
            else part_o[(row * n_split + split) * hd_v + d] = o;
        }
        if (n_split > 1 && threadIdx.x == 0) {
            part_ml[(row * n_split + split) * 2] = bm;
            part_ml[(row * n_split + split) * 2 + 1] = bl;
        }
    }
    if (n_split == 1) return;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) is_last = atomicAdd(&counters[kvh], 1) == n_split - 1;
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    for (int g = 0; g < G; g++) attn_merge(part_o, part_ml, out, (long)kvh * G + g, hd_v, n_split);
    if (threadIdx.x == 0) counters[kvh] = 0;
}
