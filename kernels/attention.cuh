// attention.cuh: merging split-K attention partials (attn_merge), shared by attention.cu and
// mla.cu (the latent attention's decode splits).
#pragma once

#include "common.cuh"

// Merge the n_split (<= 32) partials of one (token, head) row, stored `stride` slices apart per row. Reads bypass L1 (other blocks
// wrote them). The first warp reads every slice's (max, sum) at once and turns them into weights;
// then each output dimension sums the slices with independent loads (unrolled): a loop of
// dependent loads over the slices cost several microseconds per decode step.
__device__ void attn_merge(const float* part_o, const float* part_ml, float* out, long row, int hd_v, int n_split,
                           int stride) {
    __shared__ float w[32];
    __shared__ float inv_denom;
    if (threadIdx.x < 32) {
        int s = threadIdx.x;
        const float* ml = part_ml + (row * stride + s) * 2;
        float m = s < n_split ? __ldcg(ml) : -INFINITY;
        float l = s < n_split ? __ldcg(ml + 1) : 0.f;
        float gm = warp_max(m);
        float e = m == -INFINITY ? 0.f : __expf(m - gm);
        float denom = warp_sum(l * e);
        w[s] = e;
        if (s == 0) inv_denom = denom > 0.f ? 1.f / denom : 0.f;
    }
    __syncthreads();
    const float* po = part_o + row * stride * hd_v;
    for (int d = threadIdx.x; d < hd_v; d += blockDim.x) {
        float o = 0.f;
#pragma unroll 16
        for (int s = 0; s < n_split; s++) o += __ldcg(po + s * hd_v + d) * w[s];
        out[row * hd_v + d] = o * inv_denom;
    }
}

// -- Two-level merging, for a block of NT threads (attn_decode.cuh: 128 behind a named barrier;
// mla.cu: 256). A launch's n_split slices of a row group (G heads from h0, partials `stride`
// slots apart per head) merge in runs of RUN slices: the last block of a run to finish merges the
// run into its first slot, the last run merger merges the runs into `out`. One block reading all
// the slices was the long-context tail (128 slices x 8 heads = 512 KB through one SM's L2 round
// trips, ~30 us a layer on the 30B-A3B shape at 16k); now no block reads more than RUN slices.
// Counters: 1 + ceil(stride / RUN) zeroed ints per row group (the top one, one per run), left zeroed.
struct SplitMerge {
    float *part_o, *part_ml, *out;
    long h0;  // the group's first head (row of part_o / part_ml / out)
    int G, hd_v, stride;
};

// Merge partials (m, l, o) of slots first + i * step, i < n <= 32, for heads h0 .. h0 + G:
// weights e_i = exp(m_i - M), M = max m_i. final: out = sum e_i o_i / sum e_i l_i; else slot
// `first` becomes the merged partial (M, sum e_i l_i, sum e_i o_i). Shared memory: mw (G x 32
// floats) and red (NT float4s); both free again when it returns. hd_v % 4 == 0.
template <int NT, typename Sync>
__device__ __forceinline__ void split_merge(const SplitMerge& a, float* mw, float4* red, int first, int n, int step,
                                            bool final, Sync sync) {
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int n_c4 = a.hd_v / 4, n_items = a.G * n_c4;
    for (int g = warp; g < a.G; g += NT / 32) {
        float* ml = a.part_ml + (a.h0 + g) * a.stride * 2;
        int s = first + lane * step;
        float m = lane < n ? __ldcg(ml + 2 * s) : -INFINITY, l = lane < n ? __ldcg(ml + 2 * s + 1) : 0.f;
        float M = warp_max(m);
        float e = m == -INFINITY ? 0.f : __expf(m - M);  // the slot's weight
        float den = warp_sum(l * e);
        mw[g * 32 + lane] = final ? e * (den > 0.f ? 1.f / den : 0.f) : e;
        __syncwarp();
        if (!final && lane == 0) ml[2 * first] = M, ml[2 * first + 1] = den;  // lane 0 read slot `first` above
    }
    // 4 dimensions per item, 8 slots' loads in flight per thread (the merging block runs alone at
    // the end of the launch: its L2 round trips are the tail). Fewer items than threads (small G):
    // `parts` threads share an item's slots and add their sums in order in shared memory.
    int parts = 1;
    while (2 * parts * n_items <= NT) parts *= 2;
    sync();  // mw written
    for (int idx = tid; idx < n_items * parts; idx += NT) {
        int it = idx % n_items, part = idx / n_items;
        int g = it / n_c4, c4 = it - g * n_c4;
        float4* po = reinterpret_cast<float4*>(a.part_o + (a.h0 + g) * a.stride * a.hd_v) + c4;
        const float* wg = mw + g * 32;
        float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int i0 = part; i0 < n; i0 += 8 * parts) {
            float4 v[8];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                int i = i0 + u * parts;
                v[u] = i < n ? __ldcg(po + (long)(first + i * step) * n_c4) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
#pragma unroll
            for (int u = 0; u < 8; u++) {
                int i = i0 + u * parts;
                if (i >= n) break;
                float w = wg[i];
                o.x += v[u].x * w, o.y += v[u].y * w, o.z += v[u].z * w, o.w += v[u].w * w;
            }
        }
        float4* dst = final ? reinterpret_cast<float4*>(a.out + (a.h0 + g) * a.hd_v) + c4 : po + (long)first * n_c4;
        if (parts == 1) *dst = o;  // (not final: this thread alone read the item's slot `first`)
        else red[idx] = o;
    }
    if (parts > 1) {
        sync();  // every part read its slots (slot `first` included) before any write
        for (int it = tid; it < n_items; it += NT) {
            float4 o = red[it];
            for (int p = 1; p < parts; p++) {
                float4 r = red[p * n_items + it];
                o.x += r.x, o.y += r.y, o.z += r.z, o.w += r.w;
            }
            int g = it / n_c4, c4 = it - g * n_c4;
            float4* po = reinterpret_cast<float4*>(a.part_o + (a.h0 + g) * a.stride * a.hd_v) + c4;
            *(final ? reinterpret_cast<float4*>(a.out + (a.h0 + g) * a.hd_v) + c4 : po + (long)first * n_c4) = o;
        }
    }
    sync();  // mw / red read: the caller may reuse that memory
}

// Block `split` of n_split has stored its partials: count it done, and merge (two levels) when
// it is the last of its run / of the runs. flag: shared int; mw, red: as split_merge's.
template <int NT, int RUN, typename Sync>
__device__ __forceinline__ void split_merge_done(const SplitMerge& a, int* counters, int split, int n_split, int& flag,
                                                 float* mw, float4* red, Sync sync) {
    static_assert(RUN <= 32, "a run's weights are one warp's lanes");
    int n_run = (n_split + RUN - 1) / RUN;
    if (n_run > 1) {
        int run = split / RUN, r0 = run * RUN, n = min(RUN, n_split - r0);
        if (!split_last(counters + 1 + run, n, flag, sync)) return;
        split_merge<NT>(a, mw, red, r0, n, 1, false, sync);
        if (threadIdx.x == 0) counters[1 + run] = 0;  // ready for the next replay
    }
    if (!split_last(counters, n_run > 1 ? n_run : n_split, flag, sync)) return;
    split_merge<NT>(a, mw, red, 0, n_run > 1 ? n_run : n_split, n_run > 1 ? RUN : 1, true, sync);
    if (threadIdx.x == 0) *counters = 0;
}
