// moe.cuh: router softmax + top-k over one token's logits (moe_topk_row) and the block-wide
// argmax it uses, shared by moe.cu, moe_decode.cu (the fused decode router) and moe_route.cu.
#pragma once

#include "common.cuh"

#define MOE_MAX_EXPERTS 1024

// Block-wide argmax of p[0..n) with ties to the lower index; every thread gets (value, index).
__device__ __forceinline__ void moe_block_argmax(const float* p, int n, float* best_v, int* best_i) {
    __shared__ float wv[32];
    __shared__ int wi[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int e = threadIdx.x; e < n; e += blockDim.x)
        if (p[e] > bv) bv = p[e], bi = e;  // e increases per thread: ">" keeps the lower index
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
    }
    __syncthreads();  // wv/wi may still be read by a previous call
    if (lane == 0) wv[warp] = bv, wi[warp] = bi;
    __syncthreads();
    bv = lane < n_warps ? wv[lane] : -INFINITY;
    bi = lane < n_warps ? wi[lane] : 0x7fffffff;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
    }
    *best_v = bv, *best_i = bi;
}

// p = softmax(z) in float32 over one token's n_expert router logits, the k largest p (equal p:
// lower expert id first, like a stable sort), optionally divided by their sum clamped to >= 2^-14.
// One whole block; z is read through L2 (another block may have just written it).
__device__ void moe_topk_row(const float* z, int n_expert, int k, int normalize, int* my_ids, float* my_w) {
    __shared__ float p[MOE_MAX_EXPERTS];
    __shared__ float scratch[32];
    float m = -INFINITY;
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) m = fmaxf(m, __ldcg(z + e));
    m = block_max(m, scratch);
    float s = 0.f;
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) {
        p[e] = expf(__ldcg(z + e) - m);
        s += p[e];
    }
    s = block_sum(s, scratch);
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) p[e] = p[e] / s;
    __syncthreads();
    float total = 0.f;
    for (int j = 0; j < k; j++) {
        float v;
        int e;
        moe_block_argmax(p, n_expert, &v, &e);
        if (e >= n_expert) e = 0, v = 0.f;  // all scores NaN: keep the id in range (the output is NaN anyway)
        total += v;
        if (threadIdx.x == 0) my_ids[j] = e, my_w[j] = v, p[e] = -1.f;  // probabilities are >= 0
        __syncthreads();
    }
    if (normalize && threadIdx.x < k) my_w[threadIdx.x] = my_w[threadIdx.x] / fmaxf(total, 6.103515625e-5f);
}
