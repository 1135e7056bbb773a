// rope.cu: per-head RMSNorm of q and k (Qwen3, Gemma 3), NeoX-style rotary embedding, and the
// store of k and v into the f16 KV cache, in one launch.
//
// Grid (n_tok, n_head + n_head_kv); block 128 threads. Blocks with y < n_head rotate query head
// y in place; the others rotate key head y - n_head and write it, with the matching value head,
// to cache slot slot[t]. Cache layout per layer: [n_head_kv][n_ctx][head_dim] halves.
// NeoX rotation: the pair (i, i + rope_dim/2) for i < rope_dim/2 turns by pos * base^(-2i/rope_dim)
// * freq_scale; dimensions from rope_dim on pass through (partial rotary).
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(128) reflex_qk_rope_store(
    float* q, const float* k, const float* v, const float* q_norm, const float* k_norm, const int* pos,
    const int* slot, int* kv_pos, half* k_cache, half* v_cache, int n_head, int n_head_kv, int hd, int hd_v, int rope_dim,
    float base, float freq_scale, float eps, int n_ctx) {
    rx_pdl_begin();
    __shared__ float head[256];
    __shared__ float scratch[32];
    int t = blockIdx.x, h = blockIdx.y;
    bool is_q = h < n_head;
    int kvh = is_q ? 0 : h - n_head;
    const float* src = is_q ? q + ((long)t * n_head + h) * hd : k + ((long)t * n_head_kv + kvh) * hd;
    const float* nw = is_q ? q_norm : k_norm;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) head[d] = src[d];
    __syncthreads();
    if (nw) {
        float ss = 0.f;
        for (int d = threadIdx.x; d < hd; d += blockDim.x) ss += head[d] * head[d];
        float scale = rsqrtf(block_sum(ss, scratch) / hd + eps);
        for (int d = threadIdx.x; d < hd; d += blockDim.x) head[d] *= scale * nw[d];
        __syncthreads();
    }
    int half_dim = rope_dim / 2;
    // Angles in double, as the reference computes them: at position 3000 a float angle is off by
    // ~2e-4 rad. Only rope_dim/2 values per head, so the cost does not show.
    double p = (double)pos[t] * (double)freq_scale;
    for (int i = threadIdx.x; i < half_dim; i += blockDim.x) {
        double s, c;
        sincos(p * pow((double)base, -2.0 * (double)i / (double)rope_dim), &s, &c);
        float x0 = head[i], x1 = head[i + half_dim];
        head[i] = x0 * (float)c - x1 * (float)s;
        head[i + half_dim] = x0 * (float)s + x1 * (float)c;
    }
    __syncthreads();
    if (is_q) {
        float* dst = q + ((long)t * n_head + h) * hd;
        for (int d = threadIdx.x; d < hd; d += blockDim.x) dst[d] = head[d];
        return;
    }
    if (kvh == 0 && threadIdx.x == 0 && kv_pos) kv_pos[slot[t]] = pos[t];  // for sliding windows
    long s_off = (long)kvh * n_ctx + slot[t];
    for (int d = threadIdx.x; d < hd; d += blockDim.x) k_cache[s_off * hd + d] = __float2half(head[d]);
    const float* vsrc = v + ((long)t * n_head_kv + kvh) * hd_v;
    for (int d = threadIdx.x; d < hd_v; d += blockDim.x) v_cache[s_off * hd_v + d] = __float2half(vsrc[d]);
}
