// kernels/mvs.cu (the staged one-token matrix kernels) and kernels/attn_decode.cu compiled for the host
// against tests/host_emu/common.cuh and stage.cuh, in one library: the output projection's merge of the
// decode attention's slices (reflex_mvs_merge_*) reads what the attention left. C entry points take the
// launch shape first, then the kernel's own arguments (ctypes calls them).
#define dim3 cuda_dim3  // the toolkit's own dim3 (vector_types.h) under another name: the stand-in has one
#include <cuda_fp16.h>
#include <vector_functions.h>
#undef dim3

#include "common.cuh"

#define __align__(n) __attribute__((aligned(n)))
#define __noinline__ __attribute__((noinline))
// kernels/common.cuh's pieces the stand-in leaves out
#include "dequant.cuh"  // dequant8<T>, RX_FOR_EACH_TYPE
inline float rx_act(float g, int act) {
    if (act == 0) return g / (1.0f + __expf(-g));
    const float c = 0.7978845608028654f;  // sqrt(2/pi)
    return 0.5f * g * (1.0f + tanhf(c * (g + 0.044715f * g * g * g)));
}

#include "stage.cuh"
#include "attn_decode.cu"
#include "mvs.cu"

#define SHAPE unsigned gx, unsigned gy, unsigned gz, unsigned threads
#define GRID dim3{gx, gy, gz}, threads
#define SEGS_ARGS segs, row_bytes, x, K, rb, wpr, accumulate, norm_w, eps, pick
#define HEAD_PARAMS                                                                                             \
    const uint8_t *w, float *y, int rows, long row_bytes, const float *x, int K, int rpb, int chunk, int wpr, \
        const float *norm_w, float eps, MvsPick pick
#define ENTRY(name, T)                                                                                         \
    extern "C" void emu_mvs_##name(SHAPE, MVS_SEGS_PARAMS) { emu_launch(reflex_mvs_##name, GRID, SEGS_ARGS); }   \
    extern "C" void emu_mvs_post_##name(SHAPE, MVS_SEGS_PARAMS, MvsPost post) {                                  \
        emu_launch(reflex_mvs_post_##name, GRID, SEGS_ARGS, post);                                               \
    }                                                                                                            \
    extern "C" void emu_mvs_merge_##name(SHAPE, MVS_SEGS_PARAMS, MvsMerge merge) {                               \
        emu_launch(reflex_mvs_merge_##name, GRID, SEGS_ARGS, merge);                                             \
    }                                                                                                            \
    extern "C" void emu_mvs_glu_##name(SHAPE, MVS_GLU_PARAMS) { emu_launch(reflex_mvs_glu_##name, GRID, MVS_GLU_ARGS); } \
    extern "C" void emu_mvs_glu_post_##name(SHAPE, MVS_GLU_PARAMS, MvsPost post) {                               \
        emu_launch(reflex_mvs_glu_post_##name, GRID, MVS_GLU_ARGS, post);                                        \
    }                                                                                                            \
    extern "C" void emu_mvs_head_##name(SHAPE, HEAD_PARAMS) {                                                    \
        emu_launch(reflex_mvs_head_##name, GRID, w, y, rows, row_bytes, x, K, rpb, chunk, wpr, norm_w, eps, pick); \
    }
RX_FOR_EACH_TYPE(ENTRY)

#define MIXED_PARAMS MvSegsMixed segs, const float *x, int K, int rb, int wpr, int accumulate, const float *norm_w, float eps
extern "C" void emu_mvs_mixed(SHAPE, MIXED_PARAMS) {
    emu_launch(reflex_mvs_mixed, GRID, segs, x, K, rb, wpr, accumulate, norm_w, eps);
}
extern "C" void emu_mvs_mixed_post(SHAPE, MIXED_PARAMS, MvsPost post) {
    emu_launch(reflex_mvs_mixed_post, GRID, segs, x, K, rb, wpr, accumulate, norm_w, eps, post);
}

#include "attn_decode_entry.cuh"
