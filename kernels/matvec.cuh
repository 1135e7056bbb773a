// matvec.cuh: matvec.cu's matrix-vector bodies (mv_body, mv_glu_body and their pieces), shared
// with the kernels that run them over other layouts: moe.cu (routed experts), mla.cu (per-head
// matrices) and mvs.cu (MvSegs). What they compute is described in matvec.cu.
#pragma once

#include "common.cuh"

#define MV_WARPS 8  // 256 threads; a block covers 8 / wpr rows with wpr warps per row
#define MV_TOK 4

struct MvSegs {  // up to three matrices sharing type and row length; y strides = their rows
    const uint8_t* w[3];
    float* y[3];
    int rows[3];
};

// Per-token inverse RMS of x for the block (all threads take part and get the result);
// 1 when no norm is fused. One reduction per block, not per warp: 8x fewer reads of x.
template <int NT>
__device__ __forceinline__ void mv_norm_scales(const float* x, int x_stride, int K, int nt, const float* norm_w,
                                               float eps, float* inv) {
    __shared__ float part[NT][8];
    if (!norm_w) {
#pragma unroll
        for (int t = 0; t < NT; t++) inv[t] = 1.f;
        return;
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float ss = 0.f;
        if (t < nt)
            for (int k = threadIdx.x; k < K; k += blockDim.x) ss += x[(long)t * x_stride + k] * x[(long)t * x_stride + k];
        ss = warp_sum(ss);
        if (lane == 0) part[t][warp] = ss;
    }
    __syncthreads();
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float ss = 0.f;
        for (int w = 0; w < 8; w++) ss += part[t][w];
        inv[t] = rsqrtf(ss / K + eps);
    }
    __syncthreads();  // part[] is reused by the next token chunk
}

// A warp's share of R rows: groups part, part + wpr, ... (units of 32 lanes x 8 weights). The
// input x (normalized when a norm is fused) is loaded once per group and applied to all R rows,
// which divides the x traffic through L1 by R: for quantized weights x is the larger stream.
template <int T, int R, int NT>
__device__ __forceinline__ void mv_accumulate(const uint8_t* const* rows, const float* x, int x_stride, int K, int nt,
                                              const float* norm_w, const float* inv, float (*acc)[NT], int part,
                                              int wpr) {
    int lane = threadIdx.x & 31;
    for (int g = lane + RX_WARP * part; g < K / 8; g += RX_WARP * wpr) {
        float xv[NT][8];
        float4 na = make_float4(1.f, 1.f, 1.f, 1.f), nb = na;
        if (norm_w) {
            na = reinterpret_cast<const float4*>(norm_w + 8 * g)[0];
            nb = reinterpret_cast<const float4*>(norm_w + 8 * g)[1];
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
            if (t < nt) {
                const float4* xp = reinterpret_cast<const float4*>(x + (long)t * x_stride + 8 * g);
                a = xp[0], b = xp[1];
            }
            float s = inv[t];
            xv[t][0] = a.x * na.x * s, xv[t][1] = a.y * na.y * s, xv[t][2] = a.z * na.z * s, xv[t][3] = a.w * na.w * s;
            xv[t][4] = b.x * nb.x * s, xv[t][5] = b.y * nb.y * s, xv[t][6] = b.z * nb.z * s, xv[t][7] = b.w * nb.w * s;
        }
#pragma unroll
        for (int rr = 0; rr < R; rr++) {
            float w[8];
            dequant8<T>(rows[rr], g, w);
#pragma unroll
            for (int t = 0; t < NT; t++)
                acc[rr][t] += w[0] * xv[t][0] + w[1] * xv[t][1] + w[2] * xv[t][2] + w[3] * xv[t][3] + w[4] * xv[t][4] +
                              w[5] * xv[t][5] + w[6] * xv[t][6] + w[7] * xv[t][7];
        }
    }
}

// Sum each row's dot product over its lanes and (wpr > 1) its warps; true for the lane that
// holds the totals. With one warp per row there is no shared memory and no barrier.
template <int R, int NT>
__device__ __forceinline__ bool mv_reduce(float (*acc)[NT], int wpr) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int rr = 0; rr < R; rr++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[rr][t] = warp_sum(acc[rr][t]);
    if (wpr == 1) return lane == 0;
    __shared__ float red[MV_WARPS][R * NT];
    if (lane == 0)
#pragma unroll
        for (int rr = 0; rr < R; rr++)
#pragma unroll
            for (int t = 0; t < NT; t++) red[warp][rr * NT + t] = acc[rr][t];
    __syncthreads();
    bool owner = lane == 0 && warp % wpr == 0;
    if (owner)
#pragma unroll
        for (int rr = 0; rr < R; rr++)
#pragma unroll
            for (int t = 0; t < NT; t++) {
                float v = 0.f;
                for (int w = warp; w < warp + wpr; w++) v += red[w][rr * NT + t];
                acc[rr][t] = v;
            }
    __syncthreads();  // red[] is reused by the next token chunk
    return owner;
}

// Rows r0 .. r0 + R - 1 of one segment (the host keeps every segment's rows a multiple of R).
template <int T, int R, int NT>
__device__ void mv_body(MvSegs segs, long row_bytes, const float* x, int x_stride, int K, int n_tok, int accumulate,
                        const float* norm_w, float eps, int wpr) {
    int warp = threadIdx.x >> 5;
    int r0 = (blockIdx.x * (MV_WARPS / wpr) + warp / wpr) * R, part = warp % wpr;
    // Which segment: select with constant indices (a dynamic index would copy the struct to local memory).
    const uint8_t* w = segs.w[0];
    float* y = segs.y[0];
    int y_stride = segs.rows[0];
    if (r0 >= segs.rows[0]) {
        r0 -= segs.rows[0];
        w = segs.w[1], y = segs.y[1], y_stride = segs.rows[1];
        if (r0 >= segs.rows[1]) {
            r0 -= segs.rows[1];
            w = segs.w[2], y = segs.y[2], y_stride = segs.rows[2];
        }
    }
    bool live = r0 < y_stride;  // no early return: blocks with wpr > 1 synchronize below
    const uint8_t* rows[R];
#pragma unroll
    for (int rr = 0; rr < R; rr++) rows[rr] = w + (long)(live ? r0 + rr : 0) * row_bytes;
    // Tokens: blockIdx.y's share of them in whole steps of NT (a launch of few rows and many
    // tokens spreads its tokens over gridDim.y blocks instead of looping through all of them).
    int per = (n_tok + gridDim.y - 1) / gridDim.y;
    per = (per + NT - 1) / NT * NT;
    int t_lo = blockIdx.y * per, t_hi = min(n_tok, t_lo + per);
    for (int t0 = t_lo; t0 < t_hi; t0 += NT) {
        int nt = min(NT, t_hi - t0);
        float inv[NT], acc[R][NT];
#pragma unroll
        for (int rr = 0; rr < R; rr++)
#pragma unroll
            for (int t = 0; t < NT; t++) acc[rr][t] = 0.f;
        const float* xt = x + (long)t0 * x_stride;
        mv_norm_scales<NT>(xt, x_stride, K, nt, norm_w, eps, inv);
        if (live) mv_accumulate<T, R, NT>(rows, xt, x_stride, K, nt, norm_w, inv, acc, part, wpr);
        if (mv_reduce<R, NT>(acc, wpr) && live) {
#pragma unroll
            for (int rr = 0; rr < R; rr++)
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    if (t < nt) {
                        float* dst = y + (long)(t0 + t) * y_stride + r0 + rr;
                        *dst = accumulate ? *dst + acc[rr][t] : acc[rr][t];
                    }
                }
        }
    }
}

// Gate and up projections in one pass, writing act(gate) * up (SwiGLU / GeGLU).
template <int T, int NT>
__device__ void mv_glu_body(const uint8_t* Wg, const uint8_t* Wu, long row_bytes, const float* x, int x_stride,
                            float* y, int y_stride, int n_rows, int K, int n_tok, int act, const float* norm_w,
                            float eps, int wpr) {
    int warp = threadIdx.x >> 5;
    int r = blockIdx.x * (MV_WARPS / wpr) + warp / wpr, part = warp % wpr;
    bool live = r < n_rows;
    long off = (long)(live ? r : 0) * row_bytes;
    const uint8_t* rows[2] = {Wg + off, Wu + off};  // gate and up share every x load
    for (int t0 = 0; t0 < n_tok; t0 += NT) {
        int nt = min(NT, n_tok - t0);
        float inv[NT], acc[2][NT];
#pragma unroll
        for (int t = 0; t < NT; t++) acc[0][t] = acc[1][t] = 0.f;
        const float* xt = x + (long)t0 * x_stride;
        mv_norm_scales<NT>(xt, x_stride, K, nt, norm_w, eps, inv);
        if (live) mv_accumulate<T, 2, NT>(rows, xt, x_stride, K, nt, norm_w, inv, acc, part, wpr);
        if (mv_reduce<2, NT>(acc, wpr) && live) {
#pragma unroll
            for (int t = 0; t < NT; t++)
                if (t < nt) y[(long)(t0 + t) * y_stride + r] = rx_act(acc[0][t], act) * acc[1][t];
        }
    }
}
