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
