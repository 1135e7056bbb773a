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
// Grid (row blocks, token blocks): blockIdx.y takes an even run of the tokens (whole steps of 4),
// so a few rows and many tokens (a router, Qwen3.5's gates over a prompt) still fill the GPU.
// Bound by weight bytes: row_bytes * rows per 4 tokens of a block.
// Requirements (checked on the host): K % 32 == 0, x rows 16-byte aligned (stride % 4 == 0).
#include "matvec.cuh"

#define RX_MV(name, T)                                                                                           \
    extern "C" __global__ void __launch_bounds__(256) reflex_mv_##name(MvSegs segs, long row_bytes,              \
                                                                       const float* x, int x_stride, int K,      \
                                                                       int n_tok, int accumulate,                \
                                                                       const float* norm_w, float eps, int wpr,  \
                                                                       int rpw) {                                \
        rx_pdl_begin();                                                                                          \
        if (n_tok > 1) mv_body<T, 1, MV_TOK>(segs, row_bytes, x, x_stride, K, n_tok, accumulate, norm_w, eps, wpr); \
        else if (rpw == 4) mv_body<T, 4, 1>(segs, row_bytes, x, x_stride, K, 1, accumulate, norm_w, eps, wpr);   \
        else if (rpw == 2) mv_body<T, 2, 1>(segs, row_bytes, x, x_stride, K, 1, accumulate, norm_w, eps, wpr);   \
        else mv_body<T, 1, 1>(segs, row_bytes, x, x_stride, K, 1, accumulate, norm_w, eps, wpr);                 \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(256) reflex_mv_glu_##name(                                      \
        const uint8_t* Wg, const uint8_t* Wu, long row_bytes, const float* x, int x_stride, float* y,            \
        int y_stride, int n_rows, int K, int n_tok, int act, const float* norm_w, float eps, int wpr) {          \
        rx_pdl_begin();                                                                                          \
        if (n_tok > 1)                                                                                           \
            mv_glu_body<T, MV_TOK>(Wg, Wu, row_bytes, x, x_stride, y, y_stride, n_rows, K, n_tok, act, norm_w,   \
                                   eps, wpr);                                                                    \
        else                                                                                                     \
            mv_glu_body<T, 1>(Wg, Wu, row_bytes, x, x_stride, y, y_stride, n_rows, K, 1, act, norm_w, eps, wpr); \
    }

RX_FOR_EACH_TYPE(RX_MV)
