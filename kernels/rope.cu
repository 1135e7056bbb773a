// rope.cu: per-head RMSNorm of q and k (Qwen3, Gemma 3), rotary position embedding, and the
// store of k and v into the f16 KV cache, in one launch.
//
// Grid (n_tok, head groups); block ROPE_WARPS warps. A block first turns its token's rope_dim/2
// angles into cos/sin in shared memory (once per token and group instead of once per head), then
// each warp takes the group's heads h = warp, warp + ROPE_WARPS, ... in its own shared row: query
// heads (h < n_head) are rotated in place, key heads (h - n_head) written, with the matching value
// head, to cache slot slot[t] (its row through kv_blocks, common.cuh). No block barrier after the
// angles. Cache layout per layer: [n_head_kv][n_rows][head_dim] halves. Groups of heads_per_block heads (gpu/ops/rope.py): a whole
// token per block for prompts, fewer heads a block for a few tokens (more blocks in flight).
// Rotation pair i < rope_dim/2 turns by pos * freq_scale * base^(-2i/rope_dim) / factor_i:
//   NeoX (pairwise = 0): the pair (i, i + rope_dim/2) (Qwen3, Gemma 3);
//   normal (pairwise = 1): adjacent dims (2i, 2i + 1) (llama.cpp's "normal" rope, used by Llama,
//   whose converter permutes the q/k rows so that HF's halves become adjacent pairs).
// freq_factors (NULL: all 1) holds one factor per pair (Llama 3.1+'s rope_freqs tensor);
// freq_scale is 1 / the linear scaling factor. Dimensions from rope_dim on pass through.
// Bound by latency: a few KB per token.
#include "common.cuh"

#define ROPE_WARPS 8
#define ROPE_MAX_HD 256  // head_dim <= 256 (Gemma 3's), checked by the launcher

extern "C" __global__ void __launch_bounds__(ROPE_WARPS * 32) reflex_qk_rope_store(
    float* q, const float* k, const float* v, const float* q_norm, const float* k_norm, const int* pos,
    const int* slot, int* kv_pos, half* k_cache, half* v_cache, int n_head, int n_head_kv, int hd, int hd_v, int rope_dim,
    float base, float freq_scale, const float* freq_factors, int pairwise, float eps, int n_rows, int heads_per_block,
    const int* kv_blocks) {
    rx_pdl_begin();
    __shared__ float cos_t[ROPE_MAX_HD / 2], sin_t[ROPE_MAX_HD / 2];
    __shared__ float rows[ROPE_WARPS][ROPE_MAX_HD];
    int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, half_dim = rope_dim / 2;
    // Angles in double, as the reference computes them: at position 3000 a float angle is off by
    // ~2e-4 rad.
    double p = (double)pos[t] * (double)freq_scale;
    for (int i = threadIdx.x; i < half_dim; i += blockDim.x) {
        double ang = p * pow((double)base, -2.0 * (double)i / (double)rope_dim);
        if (freq_factors) ang /= (double)freq_factors[i];
        double s, c;
        sincos(ang, &s, &c);
        cos_t[i] = (float)c, sin_t[i] = (float)s;
    }
    __syncthreads();
    float* row = rows[warp];
    int h_end = min(n_head + n_head_kv, ((int)blockIdx.y + 1) * heads_per_block);
    for (int h = blockIdx.y * heads_per_block + warp; h < h_end; h += ROPE_WARPS) {
        bool is_q = h < n_head;
        int kvh = is_q ? 0 : h - n_head;
        const float* src = is_q ? q + ((long)t * n_head + h) * hd : k + ((long)t * n_head_kv + kvh) * hd;
        const float* nw = is_q ? q_norm : k_norm;
        float ss = 0.f;
        for (int d = lane; d < hd; d += 32) {
            float x = src[d];
            row[d] = x, ss += x * x;
        }
        if (nw) {
            float scale = rsqrtf(warp_sum(ss) / hd + eps);
            for (int d = lane; d < hd; d += 32) row[d] *= scale * nw[d];
        }
        __syncwarp();
        for (int i = lane; i < half_dim; i += 32) {
            int a = pairwise ? 2 * i : i, b = pairwise ? 2 * i + 1 : i + half_dim;  // each lane owns its pair
            float x0 = row[a], x1 = row[b];
            row[a] = x0 * cos_t[i] - x1 * sin_t[i];
            row[b] = x0 * sin_t[i] + x1 * cos_t[i];
        }
        __syncwarp();
        if (is_q) {
            float* dst = q + ((long)t * n_head + h) * hd;
            for (int d = lane; d < hd; d += 32) dst[d] = row[d];
        } else {
            if (kvh == 0 && lane == 0 && kv_pos) kv_pos[slot[t]] = pos[t];  // for sliding windows
            long s_off = (long)kvh * n_rows + rx_kv_row(kv_blocks, slot[t]);
            for (int d = lane; d < hd; d += 32) k_cache[s_off * hd + d] = __float2half(row[d]);
            const float* vsrc = v + ((long)t * n_head_kv + kvh) * hd_v;
            for (int d = lane; d < hd_v; d += 32) v_cache[s_off * hd_v + d] = __float2half(vsrc[d]);
        }
        __syncwarp();  // the row is the warp's next head's
    }
}
