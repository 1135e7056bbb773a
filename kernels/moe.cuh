// moe.cuh: router softmax + top-k over one token's logits (moe_topk_row) and the block-wide
// argmax it uses, shared by moe.cu, moe_decode.cu (the fused decode router) and moe_route.cu.
#pragma once

#include "common.cuh"
#include "state.cuh"  // rx_warp_argmax

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

#define MOE_WARP_PER_LANE 8  // moe_topk_warp: experts per lane (n_expert <= 256)

// moe_topk_row's work in warp 0 alone, the probabilities in registers (lane l holds experts l,
// l + 32, ...): no block barrier per pick. The same picks, weights and ties as the block version.
__device__ void moe_topk_warp(const float* z, int n_expert, int k, int normalize, int* my_ids, float* my_w) {
    int lane = threadIdx.x & 31;
    float p[MOE_WARP_PER_LANE], m = -INFINITY, s = 0.f, total = 0.f;
#pragma unroll
    for (int j = 0; j < MOE_WARP_PER_LANE; j++) {
        int e = lane + 32 * j;
        p[j] = e < n_expert ? __ldcg(z + e) : -INFINITY;
        m = fmaxf(m, p[j]);
    }
    m = warp_max(m);
#pragma unroll
    for (int j = 0; j < MOE_WARP_PER_LANE; j++) {
        p[j] = lane + 32 * j < n_expert ? expf(p[j] - m) : 0.f;
        s += p[j];
    }
    s = warp_sum(s);
#pragma unroll
    for (int j = 0; j < MOE_WARP_PER_LANE; j++) p[j] = lane + 32 * j < n_expert ? p[j] / s : -1.f;
    for (int r = 0; r < k; r++) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
#pragma unroll
        for (int j = 0; j < MOE_WARP_PER_LANE; j++)
            if (p[j] > bv) bv = p[j], bi = lane + 32 * j;  // j increases: ">" keeps the lower id
        rx_warp_argmax(bv, bi);
        if (bi >= n_expert) bi = 0, bv = 0.f;  // all scores NaN: keep the id in range (the output is NaN anyway)
        total += bv;
        if (lane == 0) my_ids[r] = bi, my_w[r] = bv;
#pragma unroll
        for (int j = 0; j < MOE_WARP_PER_LANE; j++)
            if (lane + 32 * j == bi) p[j] = -1.f;  // probabilities are >= 0
    }
    __syncwarp();
    if (normalize && lane < k) my_w[lane] = my_w[lane] / fmaxf(total, 6.103515625e-5f);
}

// p = softmax(z) in float32 over one token's n_expert router logits, the k largest p (equal p:
// lower expert id first, like a stable sort), optionally divided by their sum clamped to >= 2^-14.
// One whole block; z is read through L2 (another block may have just written it). Up to 256
// experts and k <= 32 (every MoE file we know), warp 0 does it alone (moe_topk_warp).
__device__ void moe_topk_row(const float* z, int n_expert, int k, int normalize, int* my_ids, float* my_w) {
    if (n_expert <= 32 * MOE_WARP_PER_LANE && k <= 32) {
        if (threadIdx.x < 32) moe_topk_warp(z, n_expert, k, normalize, my_ids, my_w);
        return;
    }
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
