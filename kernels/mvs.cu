// mvs.cu: one-token matrix-vector products for the decode step, each block's weights staged
// into shared memory before the block waits for its predecessor.
//
//   reflex_mvs_*       y_s[r] (+)= dot(W_s[r, :], x')    up to three matrices (q, k, v) per launch;
//                      with pick.part_v set (one matrix: the LM head) the greedy pick is fused:
//                      each block keeps its rows' argmax, the last block to finish picks the
//                      token (ties to the lower id, NaN never wins) and advances the decode state
//   reflex_mvs_merge_* one matrix (the attention output projection) whose x is the decode attention's
//                      output, merged from its slices here when the attention left them (mvs.cuh MvsMerge)
//   reflex_mvs_mixed   the same for matrices of different types (a switch per block)
//   reflex_mvs_head_*  one matrix (the LM head) streamed: resident blocks walk their rows through a
//                      ring of shared-memory slots (mvs.cuh mvs_stream_body), the pick fused as above
//   reflex_mvs_glu_*   y[r] = act(dot(Wg[r], x')) * dot(Wu[r], x'); with ids (MoE), block row y
//                      serves routed slot y: expert ids[y]'s rows, staged after the wait; with
//                      Sg / Su too, block row k serves the shared expert (staged before it)
// x' = x, or x RMS-normalized with norm_w (the block's pre-norm folded in). norm_w must be a weight
// (it is read before the wait, like the matrix). The _post kernels (reflex_mvs_post_*, _mixed_post,
// _glu_post_*) take an MvsPost: x is first x + norm(src) * w, a post-norm folded in (mvs.cuh
// mvs_post_x), also left in post.x_out.
//
// Why: a decode step's matrices are 1-7 MB; warps that load as they go pay a chain of memory
// latencies after the kernel starts. Here each block owns rb contiguous rows (contiguous bytes),
// copies them into shared memory with 16-byte cp.async (stage.cuh), and only then waits for its
// predecessor, so in the PDL-chained decode graph the weight traffic overlaps the previous kernel
// and what is left after the wait is one read of x and arithmetic on shared memory. x' sits in
// registers: lane l of a warp holds the groups of 8 inputs g = l + 32 (part + wpr i), i < MVS_NX;
// wpr warps share a row (each a part of K) and 8 / wpr rows are in work at once; each row's
// partial sums meet in shared memory and one thread finishes the row.
// Launch: 256 threads; grid and dynamic smem from gpu/ops/mvs.py (plan):
//   smem = ranges * rx_stage_bytes(rb * row_bytes) + ranges * rb * wpr * 4.
// Requirements (host-checked): K % 8 == 0, K <= 8 * 32 * MVS_NX * wpr, x 16-byte aligned, rows
// 16-byte aligned for the K-quant decoders (as in matvec.cu).
// Bound by DRAM for large matrices (the LM head), by one memory latency and the grid-to-grid
// handover for the small ones.
#include "mvs.cuh"

// The segments and gate/up kernels, each without and with a folded post-norm (_post): two
// instantiations, so the kernels most files run keep their code and registers.
// (The segments' body is a macro, not a function: as a function taking MvSegs by reference the plain
// kernels' SASS moved away from the measured one.)
#define MVS_SEGS_BODY(T, POST, POST_V, MERGE, MERGE_V)                                                         \
    {                                                                                                          \
        int b, s = mvs_segment(segs, rb, &b);                                                                  \
        const uint8_t* w = s == 0 ? segs.w[0] : s == 1 ? segs.w[1] : segs.w[2];                                \
        float* y = s == 0 ? segs.y[0] : s == 1 ? segs.y[1] : segs.y[2];                                        \
        int rows = s == 0 ? segs.rows[0] : s == 1 ? segs.rows[1] : segs.rows[2];                               \
        mvs_seg_body<T, POST, MERGE>(w, y, rows, row_bytes, b, x, K, rb, wpr, accumulate, norm_w, eps, pick,    \
                                     POST_V, row_bytes, MERGE_V);                                              \
    }
#define MVS_SEGS_PARAMS                                                                                      \
    MvSegs segs, long row_bytes, const float *x, int K, int rb, int wpr, int accumulate, const float *norm_w, \
        float eps, MvsPick pick
#define MVS_GLU_PARAMS                                                                                       \
    const uint8_t *Wg, const uint8_t *Wu, long row_bytes, long expert_bytes, const int *ids, const float *x,   \
        const float *norm_w, float eps, float *y, int n_rows, int K, int rb, int wpr, int act, const uint8_t *Sg, \
        const uint8_t *Su
#define MVS_GLU_ARGS Wg, Wu, row_bytes, expert_bytes, ids, x, norm_w, eps, y, n_rows, K, rb, wpr, act, Sg, Su
#define RX_MVS(name, T)                                                                                        \
    extern "C" __global__ void __launch_bounds__(MVS_THREADS, 2) reflex_mvs_##name(MVS_SEGS_PARAMS) {          \
        rx_pdl_weights_first();                                                                                \
        MVS_SEGS_BODY(T, false, MvsPost{}, false, MvsMerge{})                                                  \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(MVS_THREADS, 2) reflex_mvs_post_##name(MVS_SEGS_PARAMS,       \
                                                                                        MvsPost post) {       \
        rx_pdl_weights_first();                                                                                \
        MVS_SEGS_BODY(T, true, post, false, MvsMerge{})                                                        \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(MVS_THREADS, 2) reflex_mvs_merge_##name(MVS_SEGS_PARAMS,      \
                                                                                         MvsMerge merge) {    \
        rx_pdl_weights_first();                                                                                \
        MVS_SEGS_BODY(T, false, MvsPost{}, true, merge)                                                               \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(MVS_THREADS, 2) reflex_mvs_glu_##name(MVS_GLU_PARAMS) {       \
        rx_pdl_weights_first();                                                                                \
        mvs_glu_body<T, false>(MVS_GLU_ARGS, MvsPost{});                                                        \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(MVS_THREADS, 2) reflex_mvs_glu_post_##name(MVS_GLU_PARAMS,    \
                                                                                            MvsPost post) {   \
        rx_pdl_weights_first();                                                                                \
        mvs_glu_body<T, true>(MVS_GLU_ARGS, post);                                                              \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(MVS_THREADS, 2) reflex_mvs_head_##name(                       \
        const uint8_t* w, float* y, int rows, long row_bytes, const float* x, int K, int rpb, int chunk, int wpr, \
        const float* norm_w, float eps, MvsPick pick) {                                                        \
        rx_pdl_weights_first();                                                                                \
        mvs_stream_body<T>(w, y, rows, row_bytes, x, K, rpb, chunk, wpr, norm_w, eps, pick);                   \
    }

RX_FOR_EACH_TYPE(RX_MVS)

// The mixed-type segments kernel: a switch over every type, uniform per block; _post with a folded post-norm.
#define RX_MVS_CASE(name, T)                                                                              \
    case T:                                                                                               \
        mvs_seg_body<T, POST>(w, y, rows, row_bytes, b, x, K, rb, wpr, accumulate, norm_w, eps, MvsPick{}, post, \
                              x_row_bytes);                                                              \
        break;

template <bool POST>
__device__ __forceinline__ void mvs_mixed_body(const MvSegsMixed& segs, const float* x, int K, int rb, int wpr,
                                               int accumulate, const float* norm_w, float eps, const MvsPost& post) {
    int b, s = mvs_segment(segs, rb, &b);
    const uint8_t* w = s == 0 ? segs.w[0] : s == 1 ? segs.w[1] : segs.w[2];
    float* y = s == 0 ? segs.y[0] : s == 1 ? segs.y[1] : segs.y[2];
    long row_bytes = s == 0 ? segs.row_bytes[0] : s == 1 ? segs.row_bytes[1] : segs.row_bytes[2];
    int rows = s == 0 ? segs.rows[0] : s == 1 ? segs.rows[1] : segs.rows[2];
    int type = s == 0 ? segs.type[0] : s == 1 ? segs.type[1] : segs.type[2];
    long x_row_bytes = max(segs.row_bytes[0], max(segs.row_bytes[1], segs.row_bytes[2]));  // as mvs.plan sized it
    switch (type) { RX_FOR_EACH_TYPE(RX_MVS_CASE) }
}

extern "C" __global__ void __launch_bounds__(MVS_THREADS, 2)
    reflex_mvs_mixed(MvSegsMixed segs, const float* x, int K, int rb, int wpr, int accumulate, const float* norm_w,
                     float eps) {
    rx_pdl_weights_first();
    mvs_mixed_body<false>(segs, x, K, rb, wpr, accumulate, norm_w, eps, MvsPost{});
}

extern "C" __global__ void __launch_bounds__(MVS_THREADS, 2)
    reflex_mvs_mixed_post(MvSegsMixed segs, const float* x, int K, int rb, int wpr, int accumulate,
                          const float* norm_w, float eps, MvsPost post) {
    rx_pdl_weights_first();
    mvs_mixed_body<true>(segs, x, K, rb, wpr, accumulate, norm_w, eps, post);
}
