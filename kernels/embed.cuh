// embed.cuh: one token's row of embed.cu's lookup (described there), as a device function the fused
// decode step (fused_step.cu) runs too. Every thread of the block calls it.
#pragma once

#include "common.cuh"

template <int T>
__device__ __forceinline__ void rx_embed_row(const uint8_t* table, long row_bytes, int tok, float* o, int n_embd,
                                             int n_vocab, float scale) {
    bool ok = tok >= 0 && tok < n_vocab;
    const uint8_t* row = table + (long)(ok ? tok : 0) * row_bytes;
    for (int g = threadIdx.x; g < n_embd / 8; g += blockDim.x) {
        float w[8];
        dequant8<T>(row, g, w);
#pragma unroll
        for (int j = 0; j < 8; j++) o[8 * g + j] = ok ? w[j] * scale : 0.0f;
    }
}
