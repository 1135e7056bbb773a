// constrain.cu: what a decode step needs for `logprobs` and for a grammar (structured output),
// without copying the vocabulary's logits to the host:
// - reflex_logit_stats: per slice of the row, its max, its sum of exp(x - max) and its k largest
//   (value, id); the host merges the slices into logsumexp and the row's top k.
// - reflex_mask_logits: tokens whose bit is clear in the grammar's bitmask get -inf, before the pick.
// - reflex_token_logit: the logit of the token the pick chose (read from the decode state).
// Uses only what tests/host_emu/common.cuh stands in for, so tests run these kernels on the host.
#include "common.cuh"

#define RX_TOPK_MAX 20  // OpenAI's top_logprobs limit (sampling.py MAX_TOP_LOGPROBS)
#define RX_STATS_THREADS 256

// (a, ia) before (b, ib): the larger value first, the lower id on ties (reference/sampling.py).
__device__ __forceinline__ bool rx_topk_before(float a, int ia, float b, int ib) {
    return a > b || (a == b && ia < ib);
}

// One block of RX_STATS_THREADS threads per slice. part_f holds 2 + RX_TOPK_MAX floats per
// slice (max, sum of exp(x - max), the k values), part_i RX_TOPK_MAX ids (unused ones: -1).
extern "C" __global__ void __launch_bounds__(RX_STATS_THREADS) reflex_logit_stats(const float* x, int n, int k,
                                                                                   float* part_f, int* part_i) {
    rx_pdl_begin();
    __shared__ float sv[RX_STATS_THREADS];
    __shared__ int si[RX_STATS_THREADS];
    __shared__ float scratch[32];
    int per = (n + gridDim.x - 1) / gridDim.x;
    int lo = blockIdx.x * per, hi = min(n, lo + per);
    k = min(k, RX_TOPK_MAX);

    // Each thread's k largest of its strided elements, sorted (larger first).
    float tv[RX_TOPK_MAX];
    int ti[RX_TOPK_MAX];
    int have = 0;
    float m = -INFINITY;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        float v = x[i];
        m = fmaxf(m, v);
        if (k == 0 || (have == k && !rx_topk_before(v, i, tv[k - 1], ti[k - 1]))) continue;
        int j = have < k ? have++ : k - 1;
        for (; j > 0 && rx_topk_before(v, i, tv[j - 1], ti[j - 1]); j--) tv[j] = tv[j - 1], ti[j] = ti[j - 1];
        tv[j] = v, ti[j] = i;
    }
    m = block_max(m, scratch);
    float s = 0.0f;
    if (m > -INFINITY)  // an empty slice, or one of only -inf, adds nothing
        for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) s += expf(x[i] - m);
    s = block_sum(s, scratch);
    float* out_f = part_f + (long)blockIdx.x * (2 + RX_TOPK_MAX);
    int* out_i = part_i + (long)blockIdx.x * RX_TOPK_MAX;
    if (threadIdx.x == 0) out_f[0] = m, out_f[1] = s;

    // k rounds of a block-wide argmax over the threads' next candidates; the winner moves on.
    int head = 0;
    for (int r = 0; r < k; r++) {  // k is the same for every thread: the barriers match
        sv[threadIdx.x] = head < have ? tv[head] : -INFINITY;
        si[threadIdx.x] = head < have ? ti[head] : 0x7fffffff;
        __syncthreads();
        for (int half = RX_STATS_THREADS / 2; half > 0; half >>= 1) {
            if (threadIdx.x < half && rx_topk_before(sv[threadIdx.x + half], si[threadIdx.x + half], sv[threadIdx.x],
                                                     si[threadIdx.x]))
                sv[threadIdx.x] = sv[threadIdx.x + half], si[threadIdx.x] = si[threadIdx.x + half];
            __syncthreads();
        }
        int win = si[0];
        float win_v = sv[0];
        if (threadIdx.x == 0) {
            bool found = win != 0x7fffffff;  // fewer than k elements in the slice
            out_f[2 + r] = found ? win_v : -INFINITY;
            out_i[r] = found ? win : -1;
        }
        if (head < have && ti[head] == win) head++;
        __syncthreads();  // sv/si are rewritten by the next round
    }
    if (threadIdx.x == 0)
        for (int r = k; r < RX_TOPK_MAX; r++) out_f[2 + r] = -INFINITY, out_i[r] = -1;
}

// x[i] = -inf where bit i of the little-endian bitmask `words` is clear.
extern "C" __global__ void reflex_mask_logits(float* x, const unsigned* words, int n) {
    rx_pdl_begin();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && !((words[i >> 5] >> (i & 31)) & 1u)) x[i] = -INFINITY;
}

// out[0] = x[tokens[0]]: the chosen token's logit (the pick left it in the decode state's tokens[0]).
extern "C" __global__ void reflex_token_logit(const float* x, const int* tokens, float* out) {
    rx_pdl_begin();
    if (threadIdx.x == 0) out[0] = x[tokens[0]];
}
