// norm.cuh: one row of norm.cu's reflex_rmsnorm (the three forms are described there), as a
// device function the fused decode step (fused_step.cu) runs too.
#pragma once

#include "common.cuh"

// Every thread of the block calls it; scratch holds >= 32 floats.
__device__ __forceinline__ void rx_rmsnorm_row(const float* src, const float* w_src, float* resid, const float* w_out,
                                               float* out, int n, float eps, float* scratch) {
    const float* s = src;
    const float* v = s;
    if (resid) {
        float* r = resid;
        float src_scale = 1.0f;
        if (w_src) {
            float ss = 0.f;
            for (int i = threadIdx.x; i < n; i += blockDim.x) ss += s[i] * s[i];
            src_scale = rsqrtf(block_sum(ss, scratch) / n + eps);
        }
        for (int i = threadIdx.x; i < n; i += blockDim.x) r[i] += w_src ? s[i] * src_scale * w_src[i] : s[i];
        __syncthreads();
        v = r;
    }
    if (!out) return;
    float ss = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += v[i] * v[i];
    float scale = rsqrtf(block_sum(ss, scratch) / n + eps);
    float* o = out;
    for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = v[i] * scale * w_out[i];
}

