// gated.cu: the sigmoid gates of Qwen3.5's gated attention and shared expert.
//
//   reflex_gate_split   the query projection's per-head [query | gate] rows -> q and gate, each
//                       (n_tok, n_head, hd). Elementwise, one thread per output value.
//   reflex_sigmoid_mul  y[i] *= sigmoid(g[i / group]): group 1 gates every value (the attention
//                       output), group n_ff gates a token's whole row (the shared expert, by its
//                       one logit per token).
// Bound by one read and write of the activations.
#include "common.cuh"

extern "C" __global__ void reflex_gate_split(const float* qg, float* q, float* gate, long n, int hd) {
    rx_pdl_begin();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    long row = i / hd, d = i - row * hd;
    q[i] = qg[row * 2 * hd + d];
    gate[i] = qg[row * 2 * hd + hd + d];
}

extern "C" __global__ void reflex_sigmoid_mul(float* y, const float* g, long n, int group) {
    rx_pdl_begin();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] *= 1.f / (1.f + expf(-g[i / group]));
}
