// matmul.cuh: matmul.cu's WMMA tile (mm_tile), shared with moe.cu (experts over gathered rows)
// and mla.cu (per-head matrices). What it computes is described in matmul.cu.
#pragma once

#include <mma.h>

#include "common.cuh"

using namespace nvcuda;

#define MM_BM 64
#define MM_BN 128
#define MM_BK 64
#define MM_LD (MM_BK + 8)  // padded leading dimension (halves) against bank conflicts
#define MM_LDC (MM_BN + 4)

// One 64 x 128 output tile: tokens m0.. of n_tok, weight rows n0.. of n_rows. x_idx / y_idx
// (NULL: identity) map the tile's token i to its row of x / y, which lets the MoE kernels run an
// expert over the rows it was routed (gathered x, scattered y) with the same code.
template <int T>
__device__ void mm_tile(const uint8_t* W, long row_bytes, const float* x, int x_stride, const int* x_idx, float* y,
                        int y_stride, const int* y_idx, int n_rows, int K, int n_tok, int m0, int n0, int accumulate) {
    // A (tokens x K) and B (rows x K) tiles; the f32 C tile reuses the same bytes afterwards.
    __shared__ __align__(128) unsigned char smem[(MM_BM + MM_BN) * MM_LD * 2 > MM_BM * MM_LDC * 4
                                                     ? (MM_BM + MM_BN) * MM_LD * 2
                                                     : MM_BM * MM_LDC * 4];
    half* As = reinterpret_cast<half*>(smem);
    half* Bs = As + MM_BM * MM_LD;
    float* Cs = reinterpret_cast<float*>(smem);

    int tid = threadIdx.x, warp = tid >> 5;
    int wm = warp >> 2, wn = warp & 3;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);

    for (int k0 = 0; k0 < K; k0 += MM_BK) {
        // X tile: 64 x 64 floats, 16 per thread as 4 float4.
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int idx = tid + 256 * i;  // which float4 of the tile (0..1023)
            int row = idx >> 4, col = (idx & 15) * 4;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (m0 + row < n_tok) {
                long xr = x_idx ? x_idx[m0 + row] : m0 + row;
                v = *reinterpret_cast<const float4*>(x + xr * x_stride + k0 + col);
            }
            half* dst = As + row * MM_LD + col;
            dst[0] = __float2half(v.x);
            dst[1] = __float2half(v.y);
            dst[2] = __float2half(v.z);
            dst[3] = __float2half(v.w);
        }
        // W tile: 128 rows x 64 weights = 1024 groups of 8, 4 per thread.
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int gi = tid + 256 * i;
            int row = gi >> 3, gcol = gi & 7;
            float w[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
            if (n0 + row < n_rows) dequant8<T>(W + (long)(n0 + row) * row_bytes, (k0 >> 3) + gcol, w);
            half* dst = Bs + row * MM_LD + gcol * 8;
#pragma unroll
            for (int j = 0; j < 8; j++) dst[j] = __float2half(w[j]);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < MM_BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> a[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> b[2];
#pragma unroll
            for (int i = 0; i < 2; i++) wmma::load_matrix_sync(a[i], As + (wm * 32 + i * 16) * MM_LD + kk, MM_LD);
#pragma unroll
            for (int j = 0; j < 2; j++) wmma::load_matrix_sync(b[j], Bs + (wn * 32 + j * 16) * MM_LD + kk, MM_LD);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(Cs + (wm * 32 + i * 16) * MM_LDC + wn * 32 + j * 16, acc[i][j], MM_LDC,
                                    wmma::mem_row_major);
    __syncthreads();
    for (int idx = tid; idx < MM_BM * MM_BN; idx += 256) {
        int row = idx / MM_BN, col = idx % MM_BN;
        int t = m0 + row, r = n0 + col;
        if (t < n_tok && r < n_rows) {
            float* dst = y + (long)(y_idx ? y_idx[t] : t) * y_stride + r;
            float v = Cs[row * MM_LDC + col];
            *dst = accumulate ? *dst + v : v;
        }
    }
    __syncthreads();  // Cs aliases the A/B tiles of a next tile in the same block
}
