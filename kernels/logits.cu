// logits.cu: log-probabilities for scoring (system1, check): out[i] = logits[row_i, tok_i] -
// logsumexp(logits[row_i, :]). One block per requested row; bound by one read of the row.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(1024) reflex_logprob_rows(const float* logits, int n_vocab, const int* rows,
                                                                       const int* tokens, float* out) {
    rx_pdl_begin();
    __shared__ float scratch[32];
    const float* x = logits + (long)rows[blockIdx.x] * n_vocab;
    float m = -INFINITY;
    for (int i = threadIdx.x; i < n_vocab; i += blockDim.x) m = fmaxf(m, x[i]);
    m = block_max(m, scratch);
    float s = 0.f;
    for (int i = threadIdx.x; i < n_vocab; i += blockDim.x) s += __expf(x[i] - m);
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) {
        int tok = tokens[blockIdx.x];
        out[blockIdx.x] = (tok >= 0 && tok < n_vocab) ? x[tok] - m - logf(s) : -INFINITY;
    }
}

// Final logit soft-capping (Gemma 2 style): x = cap * tanh(x / cap).
extern "C" __global__ void reflex_softcap(float* x, long n, float cap) {
    rx_pdl_begin();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = cap * tanhf(x[i] / cap);
}

// Known-answer kernel for `reflex smoke`: y[i] = a * x[i] + b.
extern "C" __global__ void reflex_smoke_axpb(const float* x, float* y, int n, float a, float b) {
    rx_pdl_begin();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}
