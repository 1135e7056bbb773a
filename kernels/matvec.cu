// matvec.cu: y_s[t, r] (+)= dot(W_s[r, :], x'[t, :]) for a few tokens t, W in its GGUF blocks.
//
// The decode step's workhorse (one token) and the path for small batches (system1, short
// prompts). wpr warps (1, 2, 4 or 8) share each output row, splitting K, so a layer's matrices
// of a few thousand rows still put enough loads in flight on every SM; each lane decodes 8
// weights at a time and applies them to up to 4 tokens, so weights are read once per 4 tokens.
// Up to three weight matrices of the same type and row length run in one launch (q, k and v
// of a layer): rows are numbered across the segments. When norm_w is given, the input is
// RMS-normalized on the fly, x' = x * rsqrt(mean(x^2) + eps) * norm_w, which folds the
// pre-attention and pre-FFN norms into the matrix kernels (each warp recomputes the row's
// scale from x: K floats from L1/L2, small next to the weights).
// Bound by weight bytes: row_bytes * rows per 4 tokens.
// Requirements (checked on the host): K % 32 == 0, x rows 16-byte aligned (stride % 4 == 0).
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
__device__ __forceinline__ void mv_norm_scales(const float* x, int x_stride, int K, int nt, const float* norm_w,
                                               float eps, float* inv) {
    __shared__ float part[MV_TOK][8];
    if (!norm_w) {
#pragma unroll
        for (int t = 0; t < MV_TOK; t++) inv[t] = 1.f;
        return;
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int t = 0; t < MV_TOK; t++) {
        float ss = 0.f;
        if (t < nt)
            for (int k = threadIdx.x; k < K; k += blockDim.x) ss += x[(long)t * x_stride + k] * x[(long)t * x_stride + k];
        ss = warp_sum(ss);
        if (lane == 0) part[t][warp] = ss;
    }
    __syncthreads();
#pragma unroll
    for (int t = 0; t < MV_TOK; t++) {
        float ss = 0.f;
        for (int w = 0; w < 8; w++) ss += part[t][w];
        inv[t] = rsqrtf(ss / K + eps);
    }
    __syncthreads();  // part[] is reused by the next token chunk
}

// A warp's share of one row: groups part, part + wpr, ... (in units of 32 lanes x 8 weights).
template <int T>
__device__ __forceinline__ void mv_accumulate(const uint8_t* row, const float* x, int x_stride, int K, int nt,
                                              const float* norm_w, const float* inv, float* acc, int part, int wpr) {
    int lane = threadIdx.x & 31;
    for (int g = lane + RX_WARP * part; g < K / 8; g += RX_WARP * wpr) {
        float w[8];
        dequant8<T>(row, g, w);
        if (norm_w) {
            const float4* nw = reinterpret_cast<const float4*>(norm_w + 8 * g);
            float4 a = nw[0], b = nw[1];
            w[0] *= a.x, w[1] *= a.y, w[2] *= a.z, w[3] *= a.w, w[4] *= b.x, w[5] *= b.y, w[6] *= b.z, w[7] *= b.w;
        }
#pragma unroll
        for (int t = 0; t < MV_TOK; t++) {
            if (t < nt) {
                const float4* xp = reinterpret_cast<const float4*>(x + (long)t * x_stride + 8 * g);
                float4 a = xp[0], b = xp[1];
                acc[t] += inv[t] * (w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y +
                                    w[6] * b.z + w[7] * b.w);
            }
        }
    }
}

// Sum the wpr warps' partial dot products of each row; true for the lane that holds the total.
__device__ __forceinline__ bool mv_reduce(float* acc, int wpr) {
    __shared__ float red[8][MV_TOK];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int t = 0; t < MV_TOK; t++) {
        acc[t] = warp_sum(acc[t]);
        if (lane == 0) red[warp][t] = acc[t];
    }
    __syncthreads();
    bool owner = lane == 0 && warp % wpr == 0;
    if (owner && wpr > 1) {
#pragma unroll
        for (int t = 0; t < MV_TOK; t++) {
            float v = 0.f;
            for (int w = warp; w < warp + wpr; w++) v += red[w][t];
            acc[t] = v;
        }
    }
    __syncthreads();  // red[] is reused by the next token chunk
    return owner;
}

template <int T>
__device__ void mv_body(MvSegs segs, long row_bytes, const float* x, int x_stride, int K, int n_tok, int accumulate,
                        const float* norm_w, float eps, int wpr) {
    int warp = threadIdx.x >> 5;
    int r = blockIdx.x * (MV_WARPS / wpr) + warp / wpr, part = warp % wpr;
    // Which segment: select with constant indices (a dynamic index would copy the struct to local memory).
    const uint8_t* w = segs.w[0];
    float* y = segs.y[0];
    int y_stride = segs.rows[0];
    if (r >= segs.rows[0]) {
        r -= segs.rows[0];
        w = segs.w[1], y = segs.y[1], y_stride = segs.rows[1];
        if (r >= segs.rows[1]) {
            r -= segs.rows[1];
            w = segs.w[2], y = segs.y[2], y_stride = segs.rows[2];
        }
    }
    bool live = r < y_stride;  // no early return: the block synchronizes below
    const uint8_t* row = w + (long)(live ? r : 0) * row_bytes;
    for (int t0 = 0; t0 < n_tok; t0 += MV_TOK) {
        int nt = min(MV_TOK, n_tok - t0);
        float inv[MV_TOK], acc[MV_TOK] = {0.f, 0.f, 0.f, 0.f};
        const float* xt = x + (long)t0 * x_stride;
        mv_norm_scales(xt, x_stride, K, nt, norm_w, eps, inv);
        if (live) mv_accumulate<T>(row, xt, x_stride, K, nt, norm_w, inv, acc, part, wpr);
        if (mv_reduce(acc, wpr) && live) {
#pragma unroll
            for (int t = 0; t < MV_TOK; t++) {
                if (t < nt) {
                    float* dst = y + (long)(t0 + t) * y_stride + r;
                    *dst = accumulate ? *dst + acc[t] : acc[t];
                }
            }
        }
    }
}

// Gate and up projections in one pass, writing act(gate) * up (SwiGLU / GeGLU).
template <int T>
__device__ void mv_glu_body(const uint8_t* Wg, const uint8_t* Wu, long row_bytes, const float* x, int x_stride,
                            float* y, int y_stride, int n_rows, int K, int n_tok, int act, const float* norm_w,
                            float eps, int wpr) {
    int warp = threadIdx.x >> 5;
    int r = blockIdx.x * (MV_WARPS / wpr) + warp / wpr, part = warp % wpr;
    bool live = r < n_rows;
    long off = (long)(live ? r : 0) * row_bytes;
    for (int t0 = 0; t0 < n_tok; t0 += MV_TOK) {
        int nt = min(MV_TOK, n_tok - t0);
        float inv[MV_TOK], ag[MV_TOK] = {0.f, 0.f, 0.f, 0.f}, au[MV_TOK] = {0.f, 0.f, 0.f, 0.f};
        const float* xt = x + (long)t0 * x_stride;
        mv_norm_scales(xt, x_stride, K, nt, norm_w, eps, inv);
        if (live) {
            mv_accumulate<T>(Wg + off, xt, x_stride, K, nt, norm_w, inv, ag, part, wpr);
            mv_accumulate<T>(Wu + off, xt, x_stride, K, nt, norm_w, inv, au, part, wpr);
        }
        bool owner = mv_reduce(ag, wpr);
        mv_reduce(au, wpr);
        if (owner && live) {
#pragma unroll
            for (int t = 0; t < MV_TOK; t++)
                if (t < nt) y[(long)(t0 + t) * y_stride + r] = rx_act(ag[t], act) * au[t];
        }
    }
}

#define RX_MV(name, T)                                                                                           \
    extern "C" __global__ void __launch_bounds__(256) reflex_mv_##name(MvSegs segs, long row_bytes,              \
                                                                       const float* x, int x_stride, int K,      \
                                                                       int n_tok, int accumulate,                \
                                                                       const float* norm_w, float eps, int wpr) { \
        mv_body<T>(segs, row_bytes, x, x_stride, K, n_tok, accumulate, norm_w, eps, wpr);                        \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(256) reflex_mv_glu_##name(                                      \
        const uint8_t* Wg, const uint8_t* Wu, long row_bytes, const float* x, int x_stride, float* y,            \
        int y_stride, int n_rows, int K, int n_tok, int act, const float* norm_w, float eps, int wpr) {          \
        mv_glu_body<T>(Wg, Wu, row_bytes, x, x_stride, y, y_stride, n_rows, K, n_tok, act, norm_w, eps, wpr);    \
    }

RX_FOR_EACH_TYPE(RX_MV)
