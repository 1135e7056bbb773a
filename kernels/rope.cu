// rope.cu: per-head RMSNorm of q and k (Qwen3, Gemma 3), rotary position embedding, and the
// store of k and v into the f16 KV cache, in one launch.
//
// Grid (n_tok, n_head + n_head_kv); block 128 threads. Blocks with y < n_head rotate query head
// y in place; the others rotate key head y - n_head and write it, with the matching value head,
// to cache slot slot[t] (its row through kv_blocks, common.cuh). Cache layout per layer:
// [n_head_kv][n_rows][head_dim] halves.
// Rotation pair i < rope_dim/2 turns by pos * freq_scale * base^(-2i/rope_dim) / factor_i:
//   NeoX (pairwise = 0): the pair (i, i + rope_dim/2) (Qwen3, Gemma 3);
//   normal (pairwise = 1): adjacent dims (2i, 2i + 1) (llama.cpp's "normal" rope, used by Llama,
//   whose converter permutes the q/k rows so that HF's halves become adjacent pairs).
// freq_factors (NULL: all 1) holds one factor per pair (Llama 3.1+'s rope_freqs tensor);
// freq_scale is 1 / the linear scaling factor. Dimensions from rope_dim on pass through.
// Bound by launch latency: a few KB per token.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(128) reflex_qk_rope_store(
    float* q, const float* k, const float* v, const float* q_norm, const float* k_norm, const int* pos,
    const int* slot, int* kv_pos, half* k_cache, half* v_cache, int n_head, int n_head_kv, int hd, int hd_v, int rope_dim,
    float base, float freq_scale, const float* freq_factors, int pairwise, float eps, int n_rows, const int* kv_blocks) {
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
        double ang = p * pow((double)base, -2.0 * (double)i / (double)rope_dim);
        if (freq_factors) ang /= (double)freq_factors[i];
        double s, c;
        sincos(ang, &s, &c);
        int a = pairwise ? 2 * i : i, b = pairwise ? 2 * i + 1 : i + half_dim;  // each thread owns its pair
        float x0 = head[a], x1 = head[b];
        head[a] = x0 * (float)c - x1 * (float)s;
        head[b] = x0 * (float)s + x1 * (float)c;
    }
    __syncthreads();
    if (is_q) {
        float* dst = q + ((long)t * n_head + h) * hd;
        for (int d = threadIdx.x; d < hd; d += blockDim.x) dst[d] = head[d];
        return;
    }
    if (kvh == 0 && threadIdx.x == 0 && kv_pos) kv_pos[slot[t]] = pos[t];  // for sliding windows
    long s_off = (long)kvh * n_rows + rx_kv_row(kv_blocks, slot[t]);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) k_cache[s_off * hd + d] = __float2half(head[d]);
    const float* vsrc = v + ((long)t * n_head_kv + kvh) * hd_v;
    for (int d = threadIdx.x; d < hd_v; d += blockDim.x) v_cache[s_off * hd_v + d] = __float2half(vsrc[d]);
}
