// moe_decode.cu: the routed-expert FFN of one decode token, three launches per layer, each block's
// weights staged into shared memory (stage.cuh) and applied from there (mvs.cu's pieces):
//
//   reflex_moe_router_*   logits = W_router x' (x' = RMS-normalized x), then the last block to
//                         finish takes the softmax top-k (moe_topk_row) and writes ids, weights;
//                         optionally one more block for a few more rows of the same input
//                         (Qwen3.5's shared-expert gate), outside the top-k
//   reflex_mvs_glu_* (mvs.cu) with ids: act[s] = act(gate_e x') * (up_e x') for slot s, e = ids[s],
//                         grid (ceil(n_ff / rb), k): each routed expert's rows are read once
//   reflex_moe_mvs_down_* x[r] += sum_s w[s] * down_e act[s]  (slot order: deterministic)
//                         grid ceil(n_embd / rb): a block holds rows r0.. of all k experts; its
//                         warps split the (slot, row) dots slot-major, each slot's inputs loaded
//                         once per warp
// A shared expert of the routed experts' type and size (Qwen3.5-MoE's) can ride along as slot k of
// the last two (its rows staged with the routed ones, its down weighted by its sigmoid gate, which
// the router's extra block computed): no launches of its own at decode.
//
// Early reads (common.cuh, rx_pdl_weights_first): the router stages its weights before it waits.
// The down kernel, with `early`, reads ids / weights and stages the routed experts' rows before it
// waits: the top-k that wrote them is two launches back (router -> gate/up -> down), and a kernel
// is only launched once its predecessor has passed its own wait, i.e. once everything before the
// predecessor has finished. The gate/up kernel needs ids from its predecessor: it stages after.
// Launch: 256 threads; rb, wpr and dynamic smem from gpu/ops/mvs.py (plan).
// Bound by the routed experts' bytes: k * 3 * n_ff * n_embd weights per token.
#include "moe.cuh"  // moe_topk_row
#include "mvs.cuh"

// Router logits for the block's rb experts; the last block to finish picks the top k. W2 (n2 <=
// rb rows like the router's, e.g. a shared expert's gate): one more block computes y2 = W2 x' and
// takes no part in the top-k, so that product needs no launch of its own.
template <int T>
__device__ void moe_router_body(const uint8_t* W, long row_bytes, const float* x, const float* norm_w, float eps,
                                float* logits, int n_expert, int K, int rb, int wpr, int k, int normalize, int* ids,
                                float* weights, int* counter, const uint8_t* W2, float* y2, int n2) {
    __shared__ float scratch[MVS_WARPS];
    __shared__ int is_last;
    int n_router = (n_expert + rb - 1) / rb;
    bool extra = (int)blockIdx.x >= n_router;
    int r0 = blockIdx.x * rb, n = extra ? n2 : min(rb, n_expert - r0);
    long span = rx_stage_bytes((long)rb * row_bytes);
    const uint8_t* srow = rx_stage(rx_dyn_smem, extra ? W2 : W + (long)r0 * row_bytes, (long)n * row_bytes);
    rx_cp_commit();
    constexpr int RL = MvsRun<T>::RL;
    int part = (threadIdx.x >> 5) % wpr;
    float nw[MVS_NX][8];
    MvsX xin;
    mvs_load_nw<RL>(norm_w, K, part, wpr, nw);
    rx_pdl_begin();
    mvs_load_x<RL>(x, K, norm_w != nullptr, nw, eps, part, wpr, xin, scratch);
    rx_cp_wait_all();
    __syncthreads();
    float* red = reinterpret_cast<float*>(rx_dyn_smem + span);
    mvs_range<T>(srow, row_bytes, n, xin, K >> 3, wpr, red, 0);
    __syncthreads();
    float* out = extra ? y2 : logits + r0;
    for (int i = threadIdx.x; i < n; i += MVS_THREADS) out[i] = mvs_total(red, i, wpr);
    if (extra) return;
    __threadfence();  // our logits are visible before this block counts itself done
    __syncthreads();
    if (threadIdx.x == 0) is_last = atomicAdd(counter, 1) == n_router - 1;
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    moe_topk_row(logits, n_expert, k, normalize, ids, weights);
    if (threadIdx.x == 0) *counter = 0;  // ready for the next layer and replay
}

// Where slot s's rows r0.. are: expert ids[s]'s, or for s == k the shared expert's (Sd).
__device__ __forceinline__ const uint8_t* moe_down_rows(const uint8_t* Wd, long row_bytes, long expert_bytes,
                                                        const int* ids, int k, const uint8_t* Sd, int s, int r0) {
    return (s < k ? Wd + (long)ids[s] * expert_bytes : Sd) + (long)r0 * row_bytes;
}

// Stage rows r0 .. r0 + n of each slot's expert, range s at smem + s * span.
__device__ __forceinline__ void moe_stage_down(const uint8_t* Wd, long row_bytes, long expert_bytes, const int* ids,
                                               int k, const uint8_t* Sd, int slots, int r0, int n, long span) {
    for (int s = 0; s < slots; s++)
        rx_stage(rx_dyn_smem + s * span, moe_down_rows(Wd, row_bytes, expert_bytes, ids, k, Sd, s, r0),
                 (long)n * row_bytes);
    rx_cp_commit();
}

// Sd (a shared expert of the experts' type and size, its activation in slot k of act): one more
// slot, weighted by sigmoid(*s_logit) (Qwen3.5's gate) or 1 without s_logit.
template <int T>
__device__ void moe_mvs_down_body(const uint8_t* Wd, long row_bytes, long expert_bytes, const int* ids,
                                  const float* wts, int k, const float* act, float* x, int n_embd, int K, int rb,
                                  int wpr, int early, const uint8_t* Sd, const float* s_logit) {
    int r0 = blockIdx.x * rb, n = min(rb, n_embd - r0), slots = k + (Sd != nullptr);
    long span = rx_stage_bytes((long)rb * row_bytes);
    if (early) moe_stage_down(Wd, row_bytes, expert_bytes, ids, k, Sd, slots, r0, n, span);
    rx_pdl_begin();
    if (!early) moe_stage_down(Wd, row_bytes, expert_bytes, ids, k, Sd, slots, r0, n, span);
    float prev = (int)threadIdx.x < n ? x[r0 + threadIdx.x] : 0.f;  // the residual, issued now, used last
    // every slot's activations (the predecessor's output) in one staged run after the experts
    const float* acts = reinterpret_cast<const float*>(
        rx_stage(rx_dyn_smem + slots * span, reinterpret_cast<const uint8_t*>(act), (long)slots * K * 4));
    rx_cp_commit();
    rx_cp_wait_all();
    __syncthreads();
    float* red = reinterpret_cast<float*>(rx_dyn_smem + slots * span + rx_stage_bytes((long)slots * K * 4));
    // The slots * n (slot, row) dots in slot-major order, a contiguous share per row group (wpr
    // warps): a group mostly stays on one slot, so it loads (and quantizes) that slot's activations once.
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, groups = MVS_WARPS / wpr;
    int g = warp / wpr, part = warp - g * wpr, items = slots * n, per = (items + groups - 1) / groups;
    int cur = -1;
    MvsX xin;
    const uint8_t* srow = nullptr;
    for (int j = g * per; j < min(items, (g + 1) * per); j++) {
        int s = j / n, i = j - s * n;
        if (s != cur) {
            mvs_load_x_plain<MvsRun<T>::RL>(acts + (long)s * K, K, part, wpr, xin);
            const uint8_t* src = moe_down_rows(Wd, row_bytes, expert_bytes, ids, k, Sd, s, r0);
            srow = rx_dyn_smem + s * span + (reinterpret_cast<uintptr_t>(src) & 15);
            cur = s;
        }
        float a = warp_sum(mvs_dot<T>(srow + (long)i * row_bytes, xin, lane, part, wpr, K >> 3));
        if (lane == 0) red[j * wpr + part] = a;
    }
    __syncthreads();
    float w_shared = s_logit ? 1.f / (1.f + expf(-*s_logit)) : 1.f;  // as gated.cu's reflex_sigmoid_mul
    for (int i = threadIdx.x; i < n; i += MVS_THREADS) {
        float v = 0.f;
        for (int s = 0; s < slots; s++)  // slot order: deterministic
            v += (s < k ? wts[s] : w_shared) * mvs_total(red, s * n + i, wpr);
        x[r0 + i] = (i == (int)threadIdx.x ? prev : x[r0 + i]) + v;
    }
}

#define RX_MOE_ROUTER(name, T)                                                                                      \
    extern "C" __global__ void __launch_bounds__(MVS_THREADS, 2) reflex_moe_router_##name(                         \
        const uint8_t* W, long row_bytes, const float* x, const float* norm_w, float eps, float* logits,            \
        int n_expert, int K, int rb, int wpr, int k, int normalize, int* ids, float* weights, int* counter,        \
        const uint8_t* W2, float* y2, int n2) {                                                                     \
        rx_pdl_weights_first();                                                                                     \
        moe_router_body<T>(W, row_bytes, x, norm_w, eps, logits, n_expert, K, rb, wpr, k, normalize, ids, weights,  \
                           counter, W2, y2, n2);                                                                    \
    }

// Routers are stored as floats (ffn_gate_inp stays F32 in quantized files): no quantized copies.
RX_MOE_ROUTER(f32, RX_F32)
RX_MOE_ROUTER(f16, RX_F16)
RX_MOE_ROUTER(bf16, RX_BF16)

#define RX_MOE_DOWN(name, T)                                                                                        \
    extern "C" __global__ void __launch_bounds__(MVS_THREADS, 2) reflex_moe_mvs_down_##name(                       \
        const uint8_t* Wd, long row_bytes, long expert_bytes, const int* ids, const float* wts, int k,              \
        const float* act, float* x, int n_embd, int K, int rb, int wpr, int early, const uint8_t* Sd,               \
        const float* s_logit) {                                                                                     \
        rx_pdl_weights_first();                                                                                     \
        moe_mvs_down_body<T>(Wd, row_bytes, expert_bytes, ids, wts, k, act, x, n_embd, K, rb, wpr, early, Sd,       \
                             s_logit);                                                                              \
    }

RX_FOR_EACH_TYPE(RX_MOE_DOWN)
