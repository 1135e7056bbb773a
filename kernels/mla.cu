// mla.cu: multi-head latent attention (DeepSeek-V2/V3 MLA) over the latent KV cache.
//
// The cache keeps one row per token, [c (r = kv_lora_rank) | k_pe (rope)] in f16, d = r + rope
// halves, shared by every query head (one "KV head"); slot j is row rx_kv_row(kv_blocks, j)
// (common.cuh: the paged cache of serving). Attention runs in the absorbed form:
//   qm[t, h] = [W_k[h]^T q_nope[t, h] | rope(q_pe[t, h])]            (d floats per head)
//   att[t, h] = softmax_j(qm[t, h] . row_j * scale) . c_j               (r floats per head)
//   o[t, h]   = W_v[h] att[t, h]                                         (v_head floats per head)
// Kernels (launched from gpu/ops/mla.py; the MoE and other matrices use matvec/matmul.cu):
//   reflex_mla_rope_store    q_pe rotated into qm[.., r:]; c RMS-normalized and k_pe rotated into
//                            the cache slot. Pairwise ("normal") RoPE, x[2i], x[2i+1], by the
//                            per-pair frequencies the host computed (YaRN included), angles in
//                            double, cos/sin times attn_factor. Grid (n_tok, n_head + 1), 128.
//   reflex_mla_mv_*          per-head matrix-vector products y[t, h] = W_h x[t, h] (any weight
//                            type, strided x/y: the absorption W_k^T q_nope of the split layout and
//                            the value up-projection W_v). Grid (rows / (8 / wpr), n_head), 256.
//   reflex_mla_mm_*          the same on tensor cores for many tokens (mm_tile of matmul.cu).
//                            Grid (rows / 128, n_tok / 64, n_head), 256. K % 64 == 0.
//   reflex_mla_mv_t_*        y[t, h] = W_h^T x[t, h] for the legacy attn_kv_b layout, whose
//                            per-head W_k has rows of r (the split layout stores W_k^T). Each
//                            thread owns 8 output columns, the rows are split across the block.
//                            Grid (n_head, n_tok / 4), 256. K (= r) <= 2048.
//   reflex_mla_attn          the attention. Grid (n_tok, n_split, ceil(n_head / 8)), 256 threads:
//                            a block takes 8 query heads of one token and a slice of its visible
//                            keys, so each cache row it stages (16 rows per tile in shared memory)
//                            serves 8 heads; warps score 2 keys x 8 heads each, an online softmax
//                            per head, then each thread accumulates 2 latent columns of all 8
//                            heads. Decode splits the keys over up to 128 blocks (16 keys each at
//                            least), merged in two levels (attention.cuh split_merge_done: runs of
//                            16 slices, then the runs).
//                            Visible slots as in attention.cu (system1's tree): j <= slot[t] and
//                            (j < prefix_len or j >= seg_lo[t]); without a prefix the keys start
//                            at seg_lo[t] (a decode row of continuous batching: its own range).
//                            r <= 512, d <= 640, d % 8 == 0.
// Bound by reading the latent cache once per 8 heads (decode: n_kv * d * 2 bytes per head group)
// and by the per-head weight bytes of W_k and W_v.
#include "attention.cuh"  // split_merge_done
#include "matmul.cuh"     // mm_tile
#include "matvec.cuh"     // mv_accumulate, mv_reduce

#define MLA_MAX_PAIRS 64  // rope dims <= 128
#define MLA_HEADS 8       // query heads per attention block (one per warp in the softmax step)
#define MLA_RUN 16        // decode slices merged by one block (split_merge_done's runs)
#define MLA_COUNTERS (1 + 128 / MLA_RUN)  // per (token, head group): the top merge's, one per run (<= 128 slices)
#define MLA_KT 16         // keys per shared-memory tile (2 per warp in the score step)
#define MLA_MAXD 640      // r + rope
#define MLA_MAXR 512      // 2 latent columns per thread, 256 threads
#define MLA_TOK 4         // tokens per block of the transposed product

// Per-pair rotation frequencies (radians per position), computed on the host in double.
struct MlaRope {
    double freq[MLA_MAX_PAIRS];
};

__device__ __forceinline__ void mla_rotate(const float* src, float* dst, half* dst_h, int n_pairs, double pos,
                                           const MlaRope& tab, float attn_factor) {
    for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) {
        double s, c;
        sincos(pos * tab.freq[i], &s, &c);
        float cf = (float)(c * (double)attn_factor), sf = (float)(s * (double)attn_factor);
        float x0 = src[2 * i], x1 = src[2 * i + 1];
        float y0 = x0 * cf - x1 * sf, y1 = x1 * cf + x0 * sf;
        if (dst) dst[2 * i] = y0, dst[2 * i + 1] = y1;
        else dst_h[2 * i] = __float2half(y0), dst_h[2 * i + 1] = __float2half(y1);
    }
}

// q: (n_tok, n_head, nope + rope) projected queries; qm: (n_tok, n_head, r + rope), only its
// rope part is written here; kv: (n_tok, r + rope) = [c | k_pe] before norm and rotation.
extern "C" __global__ void __launch_bounds__(128) reflex_mla_rope_store(
    const float* q, float* qm, const float* kv, const float* kv_norm, const int* pos, const int* slot, half* cache,
    const __grid_constant__ MlaRope tab, float attn_factor, int n_head, int nope, int rope, int r, float eps,
    const int* kv_blocks) {
    rx_pdl_begin();
    __shared__ float scratch[32];
    int t = blockIdx.x, h = blockIdx.y, d = r + rope;
    double p = (double)pos[t];
    if (h < n_head) {
        const float* src = q + ((long)t * n_head + h) * (nope + rope) + nope;
        mla_rotate(src, qm + ((long)t * n_head + h) * d + r, nullptr, rope / 2, p, tab, attn_factor);
        return;
    }
    const float* src = kv + (long)t * d;
    half* dst = cache + rx_kv_row(kv_blocks, slot[t]) * d;
    float ss = 0.f;
    for (int i = threadIdx.x; i < r; i += blockDim.x) ss += src[i] * src[i];
    float inv = rsqrtf(block_sum(ss, scratch) / r + eps);
    for (int i = threadIdx.x; i < r; i += blockDim.x) dst[i] = __float2half(src[i] * inv * kv_norm[i]);
    mla_rotate(src + r, nullptr, dst + r, rope / 2, p, tab, attn_factor);
}

// y[t, h, i] = sum_k W_h[i, k] x[t, h, k] for i < n_rows, k < K; W_h = W + h * head_bytes.
template <int T, int NT>
__device__ void mla_mv_body(const uint8_t* W, long row_bytes, long head_bytes, const float* x, int x_tok, int x_head,
                            float* y, int y_tok, int y_head, int n_rows, int K, int n_tok, int wpr) {
    int h = blockIdx.y, warp = threadIdx.x >> 5;
    int r = blockIdx.x * (MV_WARPS / wpr) + warp / wpr, part = warp % wpr;
    bool live = r < n_rows;  // no early return: mv_reduce synchronizes the block when wpr > 1
    const uint8_t* rows[1] = {W + h * head_bytes + (long)(live ? r : 0) * row_bytes};
    const float* xh = x + (long)h * x_head;
    float* yh = y + (long)h * y_head;
    for (int t0 = 0; t0 < n_tok; t0 += NT) {
        int nt = min(NT, n_tok - t0);
        float inv[NT], acc[1][NT];
#pragma unroll
        for (int t = 0; t < NT; t++) inv[t] = 1.f, acc[0][t] = 0.f;
        if (live) mv_accumulate<T, 1, NT>(rows, xh + (long)t0 * x_tok, x_tok, K, nt, nullptr, inv, acc, part, wpr);
        if (mv_reduce<1, NT>(acc, wpr) && live) {
#pragma unroll
            for (int t = 0; t < NT; t++)
                if (t < nt) yh[(long)(t0 + t) * y_tok + r] = acc[0][t];
        }
    }
}

// y[t, h, i] = sum_{j < n_in} W_h[j, i] x[t, h, j] for i < K (the row length): a transposed
// product. Thread (s, g) owns columns 8g..8g+7 and rows s, s + S, ...; shared memory sums the S
// row slices.
template <int T>
__device__ void mla_mv_t_body(const uint8_t* W, long row_bytes, long head_bytes, const float* x, int x_tok, int x_head,
                              float* y, int y_tok, int y_head, int n_in, int K, int n_tok) {
    __shared__ float red[256][9];  // 9: a padded row against bank conflicts
    int h = blockIdx.x, t0 = blockIdx.y * MLA_TOK, nt = min(MLA_TOK, n_tok - t0);
    int G = K / 8, S = blockDim.x / G;
    int g = threadIdx.x % G, s = threadIdx.x / G;
    bool live = s < S;
    const uint8_t* Wh = W + h * head_bytes;
    const float* xh = x + (long)t0 * x_tok + (long)h * x_head;
    float acc[MLA_TOK][8];
#pragma unroll
    for (int t = 0; t < MLA_TOK; t++)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[t][j] = 0.f;
    if (live) {
        for (int row = s; row < n_in; row += S) {
            float w[8];
            dequant8<T>(Wh + (long)row * row_bytes, g, w);
#pragma unroll
            for (int t = 0; t < MLA_TOK; t++) {
                if (t < nt) {
                    float xv = xh[(long)t * x_tok + row];
#pragma unroll
                    for (int j = 0; j < 8; j++) acc[t][j] += w[j] * xv;
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < MLA_TOK; t++) {
        if (t >= nt) break;  // nt is the same for the whole block
        if (live)
#pragma unroll
            for (int j = 0; j < 8; j++) red[threadIdx.x][j] = acc[t][j];
        __syncthreads();
        if (s == 0) {
            float* dst = y + (long)(t0 + t) * y_tok + (long)h * y_head + 8 * g;
            for (int j = 0; j < 8; j++) {
                float v = 0.f;
                for (int k = 0; k < S; k++) v += red[k * G + g][j];
                dst[j] = v;
            }
        }
        __syncthreads();  // red[] is rewritten for the next token
    }
}

#define RX_MLA(name, T)                                                                                            \
    extern "C" __global__ void __launch_bounds__(256) reflex_mla_mv_##name(                                        \
        const uint8_t* W, long row_bytes, long head_bytes, const float* x, int x_tok, int x_head, float* y,        \
        int y_tok, int y_head, int n_rows, int K, int n_tok, int wpr) {                                            \
        rx_pdl_begin();                                                                                            \
        if (n_tok > 1)                                                                                             \
            mla_mv_body<T, MV_TOK>(W, row_bytes, head_bytes, x, x_tok, x_head, y, y_tok, y_head, n_rows, K, n_tok,  \
                                   wpr);                                                                           \
        else                                                                                                       \
            mla_mv_body<T, 1>(W, row_bytes, head_bytes, x, x_tok, x_head, y, y_tok, y_head, n_rows, K, 1, wpr);    \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256) reflex_mla_mm_##name(                                        \
        const uint8_t* W, long row_bytes, long head_bytes, const float* x, int x_tok, int x_head, float* y,        \
        int y_tok, int y_head, int n_rows, int K, int n_tok) {                                                     \
        rx_pdl_begin();                                                                                            \
        long h = blockIdx.z;                                                                                       \
        mm_tile<T>(W + h * head_bytes, row_bytes, x + h * x_head, x_tok, nullptr, y + h * y_head, y_tok, nullptr, \
                   n_rows, K, n_tok, blockIdx.y * MM_BM, blockIdx.x * MM_BN, 0);                                   \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256) reflex_mla_mv_t_##name(                                      \
        const uint8_t* W, long row_bytes, long head_bytes, const float* x, int x_tok, int x_head, float* y,        \
        int y_tok, int y_head, int n_in, int K, int n_tok) {                                                       \
        rx_pdl_begin();                                                                                            \
        mla_mv_t_body<T>(W, row_bytes, head_bytes, x, x_tok, x_head, y, y_tok, y_head, n_in, K, n_tok);           \
    }

RX_FOR_EACH_TYPE(RX_MLA)

// q: (n_tok, n_head, d) absorbed queries; cache: (n_ctx, d) halves; out: (n_tok, n_head, r).
// n_split > 1 (decode, one token or a row per sequence; <= 128): part_o (n_tok, n_head, n_split, r),
// part_ml (n_tok, n_head, n_split, 2) and MLA_COUNTERS zeroed counters per (token, head group),
// left zeroed for the next replay.
extern "C" __global__ void __launch_bounds__(256) reflex_mla_attn(
    const float* q, const half* cache, const int* q_slot, const int* seg_lo, int prefix_len, const int* n_kv_ptr,
    float* out, float* part_o, float* part_ml, int* counters, int n_head, int r, int d, float scale, int n_split,
    const int* kv_blocks) {
    rx_pdl_begin();
    __shared__ __align__(16) float qs[MLA_HEADS][MLA_MAXD];
    __shared__ __align__(16) half ks[MLA_KT][MLA_MAXD];
    __shared__ float ps[MLA_HEADS][MLA_KT];
    __shared__ float m_s[MLA_HEADS], l_s[MLA_HEADS], c_s[MLA_HEADS];
    __shared__ int is_last;
    int t = blockIdx.x, split = blockIdx.y, h0 = blockIdx.z * MLA_HEADS;
    int nh = min(MLA_HEADS, n_head - h0);
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int my_slot = q_slot[t];
    int lo = seg_lo ? seg_lo[t] : 0;
    int n_vis = min(*n_kv_ptr, my_slot + 1);
    // Without a shared prefix no key below lo is visible: a decode row of continuous batching
    // reads its own range [lo, slot] only.
    int start = prefix_len > 0 ? 0 : min(lo, n_vis);
    // At least one tile of keys per slice; every block of the group computes the same count
    // from the same n_kv, and surplus blocks leave before any barrier. Partials sit `stride`
    // (the launch's slices) apart per row, whatever slices each row takes.
    int stride = n_split;
    n_split = min(n_split, max(1, (n_vis - start + MLA_KT - 1) / MLA_KT));
    if (split >= n_split) return;
    int chunk = (n_vis - start + n_split - 1) / n_split;
    int j0 = start + split * chunk, j1 = min(n_vis, j0 + chunk);

    for (int i = tid; i < MLA_HEADS * d; i += blockDim.x) {
        int hh = i / d, c = i - hh * d;
        qs[hh][c] = hh < nh ? q[((long)t * n_head + h0 + hh) * d + c] * scale : 0.f;
    }
    if (tid < MLA_HEADS) m_s[tid] = -INFINITY, l_s[tid] = 0.f;
    int c0 = 2 * tid;  // this thread's two latent columns, for every head
    bool own = c0 < r;
    float acc[MLA_HEADS][2];
#pragma unroll
    for (int hh = 0; hh < MLA_HEADS; hh++) acc[hh][0] = acc[hh][1] = 0.f;
    __syncthreads();

    int d8 = d / 8;
    for (int jt = j0; jt < j1; jt += MLA_KT) {
        int nk = min(MLA_KT, j1 - jt);
        for (int i = tid; i < nk * d8; i += blockDim.x) {
            int kk = i / d8, c = (i - kk * d8) * 8;
            *reinterpret_cast<uint4*>(&ks[kk][c]) = *reinterpret_cast<const uint4*>(cache + rx_kv_row(kv_blocks, jt + kk) * d + c);
        }
        __syncthreads();
        // Scores: warp w scores keys 2w and 2w + 1 against the 8 heads; lanes split d. Rows kk >= nk
        // hold stale values: their scores are replaced by -inf below.
        {
            int k0 = 2 * warp, k1 = k0 + 1;
            float s0[MLA_HEADS], s1[MLA_HEADS];
#pragma unroll
            for (int hh = 0; hh < MLA_HEADS; hh++) s0[hh] = s1[hh] = 0.f;
            for (int c = 2 * lane; c < d; c += 64) {
                float2 a = __half22float2(*reinterpret_cast<const half2*>(&ks[k0][c]));
                float2 b = __half22float2(*reinterpret_cast<const half2*>(&ks[k1][c]));
#pragma unroll
                for (int hh = 0; hh < MLA_HEADS; hh++) {
                    float2 qv = *reinterpret_cast<const float2*>(&qs[hh][c]);
                    s0[hh] += qv.x * a.x + qv.y * a.y;
                    s1[hh] += qv.x * b.x + qv.y * b.y;
                }
            }
            int ja = jt + k0, jb = jt + k1;
            bool ok0 = k0 < nk && (ja < prefix_len || ja >= lo), ok1 = k1 < nk && (jb < prefix_len || jb >= lo);
#pragma unroll
            for (int hh = 0; hh < MLA_HEADS; hh++) {
                float v0 = warp_sum(s0[hh]), v1 = warp_sum(s1[hh]);
                if (lane == 0) ps[hh][k0] = ok0 ? v0 : -INFINITY, ps[hh][k1] = ok1 ? v1 : -INFINITY;
            }
        }
        __syncthreads();
        // Online softmax, warp w for head w: p = exp(s - m_new), the running sum and the factor
        // that rescales what was accumulated before this tile.
        {
            int hh = warp;
            float s = lane < MLA_KT ? ps[hh][lane] : -INFINITY;
            float m_old = m_s[hh];
            float m_new = fmaxf(m_old, warp_max(s));
            float p = s == -INFINITY ? 0.f : __expf(s - m_new);
            float corr = m_old == -INFINITY ? 0.f : __expf(m_old - m_new);
            float psum = warp_sum(p);
            if (lane < MLA_KT) ps[hh][lane] = p;
            if (lane == 0) m_s[hh] = m_new, l_s[hh] = l_s[hh] * corr + psum, c_s[hh] = corr;
        }
        __syncthreads();
        if (own) {
#pragma unroll
            for (int hh = 0; hh < MLA_HEADS; hh++) acc[hh][0] *= c_s[hh], acc[hh][1] *= c_s[hh];
            for (int kk = 0; kk < nk; kk++) {
                float2 v = __half22float2(*reinterpret_cast<const half2*>(&ks[kk][c0]));
#pragma unroll
                for (int hh = 0; hh < MLA_HEADS; hh++) {
                    float p = ps[hh][kk];
                    acc[hh][0] += p * v.x;
                    acc[hh][1] += p * v.y;
                }
            }
        }
        __syncthreads();  // ks and ps are refilled by the next tile
    }

    long row0 = (long)t * n_head + h0;
    if (n_split == 1) {
        if (own)
#pragma unroll
            for (int hh = 0; hh < MLA_HEADS; hh++) {
                if (hh < nh) {
                    float l = l_s[hh], inv = l > 0.f ? 1.f / l : 0.f;
                    *reinterpret_cast<float2*>(out + (row0 + hh) * r + c0) = make_float2(acc[hh][0] * inv, acc[hh][1] * inv);
                }
            }
        return;
    }
    if (own)
#pragma unroll
        for (int hh = 0; hh < MLA_HEADS; hh++)
            if (hh < nh)
                *reinterpret_cast<float2*>(part_o + ((row0 + hh) * stride + split) * r + c0) =
                    make_float2(acc[hh][0], acc[hh][1]);
    if (tid < nh) {
        part_ml[((row0 + tid) * stride + split) * 2] = m_s[tid];
        part_ml[((row0 + tid) * stride + split) * 2 + 1] = l_s[tid];
    }
    // Merge in two levels (attention.cuh split_merge_done): runs of MLA_RUN slices, then the runs,
    // all heads of the group at once; the key tile's memory holds the weights and partial sums.
    const SplitMerge mg{part_o, part_ml, out, row0, nh, r, stride};
    float* mw = reinterpret_cast<float*>(&ks[0][0]);
    split_merge_done<256, MLA_RUN>(mg, counters + ((long)t * gridDim.z + blockIdx.z) * MLA_COUNTERS, split, n_split,
                                   is_last, mw, reinterpret_cast<float4*>(mw + MLA_HEADS * 32), BlockSync{});
}
