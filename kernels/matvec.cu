// matvec.cu: y[t, r] (+)= dot(W[r, :], x[t, :]) for a few tokens t, W in its GGUF blocks.
//
// The decode step's workhorse (one token) and the path for small batches (system1, short
// prompts). One warp per output row, 8 rows per 256-thread block; each lane decodes 8
// weights at a time and applies them to up to 4 tokens before moving on, so weights are read
// once per 4 tokens. Bound by weight bytes: row_bytes * n_rows per 4 tokens.
// Requirements (checked on the host): K % 32 == 0, x/y rows 16-byte aligned (stride % 4 == 0).
#include "common.cuh"

#define MV_ROWS_PER_BLOCK 8
#define MV_TOK 4

template <int T>
__device__ __forceinline__ void mv_accumulate(const uint8_t* row, const float* x, int x_stride, int K, int nt,
                                              float* acc) {
    int lane = threadIdx.x & 31;
    for (int g = lane; g < K / 8; g += RX_WARP) {
        float w[8];
        dequant8<T>(row, g, w);
#pragma unroll
        for (int t = 0; t < MV_TOK; t++) {
            if (t < nt) {
                const float4* xp = reinterpret_cast<const float4*>(x + (long)t * x_stride + 8 * g);
                float4 a = xp[0], b = xp[1];
                acc[t] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z +
                          w[7] * b.w;
            }
        }
    }
}

template <int T>
__device__ void mv_body(const uint8_t* W, long row_bytes, const float* x, int x_stride, float* y, int y_stride,
                        int n_rows, int K, int n_tok, int accumulate) {
    int r = blockIdx.x * MV_ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (r >= n_rows) return;
    const uint8_t* row = W + (long)r * row_bytes;
    for (int t0 = 0; t0 < n_tok; t0 += MV_TOK) {
        int nt = min(MV_TOK, n_tok - t0);
        float acc[MV_TOK] = {0.f, 0.f, 0.f, 0.f};
        mv_accumulate<T>(row, x + (long)t0 * x_stride, x_stride, K, nt, acc);
#pragma unroll
        for (int t = 0; t < MV_TOK; t++) {
            float s = warp_sum(acc[t]);
            if (t < nt && (threadIdx.x & 31) == 0) {
                float* dst = y + (long)(t0 + t) * y_stride + r;
                *dst = accumulate ? *dst + s : s;
            }
        }
    }
}

// Gate and up projections in one pass, writing act(gate) * up (SwiGLU / GeGLU).
template <int T>
__device__ void mv_glu_body(const uint8_t* Wg, const uint8_t* Wu, long row_bytes, const float* x, int x_stride,
                            float* y, int y_stride, int n_rows, int K, int n_tok, int act) {
    int r = blockIdx.x * MV_ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (r >= n_rows) return;
    for (int t0 = 0; t0 < n_tok; t0 += MV_TOK) {
        int nt = min(MV_TOK, n_tok - t0);
        float ag[MV_TOK] = {0.f, 0.f, 0.f, 0.f}, au[MV_TOK] = {0.f, 0.f, 0.f, 0.f};
        mv_accumulate<T>(Wg + (long)r * row_bytes, x + (long)t0 * x_stride, x_stride, K, nt, ag);
        mv_accumulate<T>(Wu + (long)r * row_bytes, x + (long)t0 * x_stride, x_stride, K, nt, au);
#pragma unroll
        for (int t = 0; t < MV_TOK; t++) {
            float g = warp_sum(ag[t]), u = warp_sum(au[t]);
            if (t < nt && (threadIdx.x & 31) == 0) y[(long)(t0 + t) * y_stride + r] = rx_act(g, act) * u;
        }
    }
}

#define RX_MV(name, T)                                                                                          \
    extern "C" __global__ void __launch_bounds__(256) reflex_mv_##name(                                         \
        const uint8_t* W, long row_bytes, const float* x, int x_stride, float* y, int y_stride, int n_rows,     \
        int K, int n_tok, int accumulate) {                                                                     \
        mv_body<T>(W, row_bytes, x, x_stride, y, y_stride, n_rows, K, n_tok, accumulate);                       \
    }                                                                                                           \
    extern "C" __global__ void __launch_bounds__(256) reflex_mv_glu_##name(                                     \
        const uint8_t* Wg, const uint8_t* Wu, long row_bytes, const float* x, int x_stride, float* y,           \
        int y_stride, int n_rows, int K, int n_tok, int act) {                                                  \
        mv_glu_body<T>(Wg, Wu, row_bytes, x, x_stride, y, y_stride, n_rows, K, n_tok, act);                     \
    }

RX_FOR_EACH_TYPE(RX_MV)
