// matmul.cu: Y[t, r] (+)= sum_k X[t, k] * W[r, k] on tensor cores, for prompts of many tokens.
//
// Block tile: 64 tokens x 128 weight rows, stepping 64 along K. 256 threads (8 warps in a
// 2 x 4 grid, each a 32 x 32 piece = 2 x 2 WMMA 16x16x16 fragments). Each step converts the X
// tile to half and decodes the W tile from its GGUF blocks straight into shared memory (no
// dequantized copy of the weights ever exists in global memory), then accumulates in f32.
// Bound by tensor-core math for long prompts; weights are read once per 64 tokens.
// Requirements (checked on the host): K % 64 == 0, x rows 16-byte aligned.
#include "matmul.cuh"

#define RX_MM(name, T)                                                                                      \
    extern "C" __global__ void __launch_bounds__(256) reflex_mm_##name(                                     \
        const uint8_t* W, long row_bytes, const float* x, int x_stride, float* y, int y_stride, int n_rows, \
        int K, int n_tok, int accumulate) {                                                                 \
        rx_pdl_begin();                                                                                     \
        mm_tile<T>(W, row_bytes, x, x_stride, nullptr, y, y_stride, nullptr, n_rows, K, n_tok, blockIdx.y * MM_BM, \
                   blockIdx.x * MM_BN, accumulate);                                                         \
    }

RX_FOR_EACH_TYPE(RX_MM)
