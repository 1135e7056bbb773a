// moe_route.cu: DeepSeek-V2/V3 expert routing: router logits -> k (expert id, weight) pairs per
// token, for the routed-expert kernels of moe.cu (pair p = t * k + s, s in choice order).
//
// One block of 256 threads per token (n_expert <= 1024, n_group <= 64, k <= 256):
//   prob    softmax(logits) (V2) or sigmoid(logits) (V3), float32
//   choice  prob + bias (V3's exp_probs_b correction; NULL: none), what the ranking reads
//   groups  with n_group > 1, each group of n_expert / n_group experts is scored by its best
//           choice (V2, group_top2 = 0) or the sum of its two best (V3, group_top2 = 1); the
//           n_group_used best groups stay, the others' experts drop out
//   top-k   the k largest choices in decreasing order; weight = prob (never the bias)
//   weights divided by their sum (clamped to >= 2^-14) when `normalize`, then times `scale`
// Equal scores go to the lower group / expert id, as a stable sort orders them. Negligible work
// next to the expert matrices; it only has to keep the decode step on the GPU.
#include "moe.cuh"  // moe_block_argmax

#define ROUTE_MAX_GROUPS 64

extern "C" __global__ void __launch_bounds__(256) reflex_moe_route(const float* logits, const float* bias, int n_expert,
                                                                    int k, int sigmoid_gating, int n_group,
                                                                    int n_group_used, int group_top2, int normalize,
                                                                    float scale, int* ids, float* weights) {
    rx_pdl_begin();
    __shared__ float prob[MOE_MAX_EXPERTS];
    __shared__ float choice[MOE_MAX_EXPERTS];
    __shared__ float gscore[ROUTE_MAX_GROUPS];
    __shared__ int gkeep[ROUTE_MAX_GROUPS];
    __shared__ float scratch[32];
    const float* z = logits + (long)blockIdx.x * n_expert;
    if (sigmoid_gating) {
        for (int e = threadIdx.x; e < n_expert; e += blockDim.x) prob[e] = 1.f / (1.f + expf(-z[e]));
    } else {
        float m = -INFINITY;
        for (int e = threadIdx.x; e < n_expert; e += blockDim.x) m = fmaxf(m, z[e]);
        m = block_max(m, scratch);
        float s = 0.f;
        for (int e = threadIdx.x; e < n_expert; e += blockDim.x) {
            prob[e] = expf(z[e] - m);
            s += prob[e];
        }
        s = block_sum(s, scratch);
        for (int e = threadIdx.x; e < n_expert; e += blockDim.x) prob[e] = prob[e] / s;
    }
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) choice[e] = bias ? prob[e] + bias[e] : prob[e];
    __syncthreads();
    if (n_group > 1) {
        int per = n_expert / n_group;
        for (int g = threadIdx.x; g < n_group; g += blockDim.x) {
            const float* c = choice + g * per;
            float b1 = -INFINITY, b2 = -INFINITY;
            for (int i = 0; i < per; i++) {
                float v = c[i];
                if (v > b1) b2 = b1, b1 = v;
                else if (v > b2) b2 = v;
            }
            gscore[g] = group_top2 && per > 1 ? b1 + b2 : b1;
            gkeep[g] = 0;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int j = 0; j < n_group_used; j++) {
                int best = -1;
                for (int g = 0; g < n_group; g++)  // ">" keeps the lower group id on ties
                    if (!gkeep[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
                gkeep[best] = 1;
            }
        }
        __syncthreads();
        for (int e = threadIdx.x; e < n_expert; e += blockDim.x)
            if (!gkeep[e / per]) choice[e] = -INFINITY;
        __syncthreads();
    }
    int* my_ids = ids + (long)blockIdx.x * k;
    float* my_w = weights + (long)blockIdx.x * k;
    float total = 0.f;
    for (int j = 0; j < k; j++) {
        float v;
        int e;
        moe_block_argmax(choice, n_expert, &v, &e);
        if (e >= n_expert) e = 0;  // nothing finite left (NaN scores): keep the id in range
        float w = prob[e];
        total += w;
        if (threadIdx.x == 0) my_ids[j] = e, my_w[j] = w, choice[e] = -INFINITY;
        __syncthreads();
    }
    if (threadIdx.x < k) {
        float w = my_w[threadIdx.x];
        if (normalize) w = w / fmaxf(total, 6.103515625e-5f);
        my_w[threadIdx.x] = w * scale;
    }
}
