// moe.cu: the routed-expert FFN (Qwen3-MoE), reading the experts straight out of the stacked
// GGUF tensors: expert e's matrix is rows [e * n_rows, (e + 1) * n_rows) of the stack, so it
// starts expert_bytes = n_rows * row_bytes after expert 0. Only routed experts are ever read.
//
// Routing: reflex_moe_topk turns router logits into k (expert id, weight) pairs per token.
// Pair p = t * k + s is token t's s-th choice (in decreasing probability).
// Small batches (decode, system1, short prompts), weights read per pair:
//   reflex_moe_mv_glu_*   act[p] = act(gate_e x'[t]) * (up_e x'[t]), RMS norm of x fused
//   reflex_moe_mv_down_*  x[t] += sum_s w[p] * down_e act[p]   (slot order: deterministic; residual fused)
// Prefill, weights read once per 64 routed tokens of each expert:
//   reflex_moe_router_mm  the router's float32 logits (and a shared expert's gate) for a prompt
//   reflex_moe_group      the pairs sorted by expert, in token order inside each expert (stable),
//                         and (optionally) the list of (expert, first pair) tiles of bm pairs
//                         that gemm.cu's grouped kernels (sm_80+) take one block row each
//   reflex_moe_mm_*       (older GPUs) WMMA tiles per (expert, 128 rows) over its gathered rows
//   reflex_moe_combine    (older GPUs) x[t] += sum_s w[p] * y[p]
// Bound by the routed experts' weight bytes: k * 3 * n_ff * n_embd weights per decode token.
#include "matmul.cuh"
#include "matvec.cuh"
#include "moe.cuh"

// One block per token.
extern "C" __global__ void __launch_bounds__(256) reflex_moe_topk(const float* logits, int n_expert, int k, int normalize,
                                                                   int* ids, float* weights) {
    rx_pdl_begin();
    moe_topk_row(logits + (long)blockIdx.x * n_expert, n_expert, k, normalize, ids + (long)blockIdx.x * k,
                 weights + (long)blockIdx.x * k);
}

template <int T>
__device__ void moe_down_body(const uint8_t* Wd, long row_bytes, long expert_bytes, const int* ids, const float* wts,
                              int k, const float* act, int K, float* x, int n_rows, int wpr) {
    int warp = threadIdx.x >> 5;
    int r = blockIdx.x * (MV_WARPS / wpr) + warp / wpr, part = warp % wpr;
    int t = blockIdx.y;
    bool live = r < n_rows;
    const float one[1] = {1.f};
    float total[1][1] = {{0.f}};
    for (int s = 0; s < k; s++) {
        long p = (long)t * k + s;
        const uint8_t* rows[1] = {Wd + ids[p] * expert_bytes + (long)(live ? r : 0) * row_bytes};
        float acc[1][1] = {{0.f}};
        if (live) mv_accumulate<T, 1, 1>(rows, act + p * K, K, K, 1, nullptr, one, acc, part, wpr);
        total[0][0] += wts[p] * acc[0][0];  // lane partials: the weighted sum commutes with the reduction
    }
    if (mv_reduce<1, 1>(total, wpr) && live) x[(long)t * n_rows + r] += total[0][0];
}

#define RX_MOE(name, T)                                                                                             \
    extern "C" __global__ void __launch_bounds__(256) reflex_moe_mv_glu_##name(                                     \
        const uint8_t* Wg, const uint8_t* Wu, long row_bytes, long expert_bytes, const int* ids, int k,              \
        const float* x, int x_stride, float* y, int n_rows, int K, int act, const float* norm_w, float eps, int wpr) { \
        rx_pdl_begin();                                                                                             \
        long p = blockIdx.y, off = ids[p] * expert_bytes;                                                           \
        mv_glu_body<T, 1>(Wg + off, Wu + off, row_bytes, x + (p / k) * x_stride, x_stride, y + p * n_rows, n_rows,  \
                          n_rows, K, 1, act, norm_w, eps, wpr);                                                     \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(256) reflex_moe_mv_down_##name(                                    \
        const uint8_t* Wd, long row_bytes, long expert_bytes, const int* ids, const float* wts, int k,              \
        const float* act, int K, float* x, int n_rows, int wpr) {                                                   \
        rx_pdl_begin();                                                                                             \
        moe_down_body<T>(Wd, row_bytes, expert_bytes, ids, wts, k, act, K, x, n_rows, wpr);                         \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(256) reflex_moe_mm_##name(                                         \
        const uint8_t* W, long row_bytes, long expert_bytes, const int* counts, const int* offsets,                 \
        const int* x_idx, const int* y_idx, const float* x, int x_stride, float* y, int y_stride, int n_rows,       \
        int K) {                                                                                                    \
        rx_pdl_begin();                                                                                             \
        int e = blockIdx.y, cnt = counts[e], off = offsets[e];                                                      \
        for (int m0 = 0; m0 < cnt; m0 += MM_BM)                                                                     \
            mm_tile<T>(W + e * expert_bytes, row_bytes, x, x_stride, x_idx + off, y, y_stride, y_idx + off, n_rows,  \
                       K, cnt, m0, blockIdx.x * MM_BN, 0);                                                          \
    }

RX_FOR_EACH_TYPE(RX_MOE)

// One block: counts per expert (shared atomics), their exclusive prefix sums (one warp's scan),
// then the pairs in chunks of up to 1,024: a pair's place is its expert's running position plus
// the same expert's pairs before it in the chunk (earlier warps: a per-warp count table scanned
// per expert; the same warp: __match_any_sync), so every list is in pair (token) order and the
// result does not depend on scheduling. pair_tok[i] = the pair's token. (It was one warp per
// expert scanning every pair: 74 us a layer for 4,096 pairs on the 30B-A3B shape.)
// With tile_e != NULL also the tiles of bm pairs, expert by expert: tile i covers pairs
// [offsets[tile_e[i]] + tile_m0[i], + bm) of its expert's list; *n_tiles of them.
#define GROUP_SLOTS 8192  // ints of the per-warp count table: 32 warps x 256 experts, 8 x 1,024
extern "C" __global__ void __launch_bounds__(1024) reflex_moe_group(const int* ids, int n_pairs, int n_expert, int k,
                                                                    int* counts, int* offsets, int* pair_tok,
                                                                    int* pair_id, int bm, int* tile_e, int* tile_m0,
                                                                    int* n_tiles) {
    rx_pdl_begin();
    __shared__ int cnt[MOE_MAX_EXPERTS], pos[MOE_MAX_EXPERTS], wbase[GROUP_SLOTS];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) atomicAdd(&cnt[ids[i]], 1);
    __syncthreads();
    if (warp == 0) {  // exclusive prefix sums of the counts and of the tile counts, 32 experts a step
        int at = 0, tiles = 0;
        for (int e0 = 0; e0 < n_expert; e0 += RX_WARP) {
            int e = e0 + lane, c = e < n_expert ? cnt[e] : 0, nt = tile_e ? (c + bm - 1) / bm : 0;
            int ic = c, it = nt;
#pragma unroll
            for (int d = 1; d < RX_WARP; d <<= 1) {
                int u = __shfl_up_sync(0xffffffffu, ic, d), v = __shfl_up_sync(0xffffffffu, it, d);
                if (lane >= d) ic += u, it += v;
            }
            if (e < n_expert) {
                int o = at + ic - c;
                counts[e] = c, offsets[e] = o, pos[e] = o;
                for (int m0 = 0, i = tiles + it - nt; m0 < c && tile_e; m0 += bm, i++) tile_e[i] = e, tile_m0[i] = m0;
            }
            at += __shfl_sync(0xffffffffu, ic, RX_WARP - 1), tiles += __shfl_sync(0xffffffffu, it, RX_WARP - 1);
        }
        if (tile_e && lane == 0) *n_tiles = tiles;
    }
    __syncthreads();
    const int rw = min((int)(blockDim.x >> 5), GROUP_SLOTS / n_expert);  // warps that rank a chunk
    int* mine = wbase + warp * n_expert;
    for (int c0 = 0; c0 < n_pairs; c0 += rw * RX_WARP) {
        int i = c0 + threadIdx.x;
        bool in = warp < rw && i < n_pairs;
        int e = in ? ids[i] : -1;
        if (warp < rw)
            for (int j = lane; j < n_expert; j += RX_WARP) mine[j] = 0;
        __syncwarp();
        unsigned peers = __match_any_sync(0xffffffffu, e);
        int rank = __popc(peers & ((1u << lane) - 1));
        if (in && rank == 0) mine[e] = __popc(peers);
        __syncthreads();
        for (int j = threadIdx.x; j < n_expert; j += blockDim.x) {  // counts -> each warp's first place
            int s = pos[j];
            for (int w = 0; w < rw; w++) {
                int c = wbase[w * n_expert + j];
                wbase[w * n_expert + j] = s, s += c;
            }
            pos[j] = s;
        }
        __syncthreads();
        if (in) {
            int dst = mine[e] + rank;
            pair_id[dst] = i;
            pair_tok[dst] = i / k;
        }
        __syncthreads();  // the table is rewritten by the next chunk
    }
}

// x[t, c] += sum_s w[t * k + s] * y[t * k + s, c], slots in order.
extern "C" __global__ void reflex_moe_combine(const float* y, const float* wts, int k, float* x, int n_embd, int n_tok) {
    rx_pdl_begin();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)n_tok * n_embd) return;
    long t = i / n_embd, c = i % n_embd;
    float s = 0.f;
    for (int j = 0; j < k; j++) s += wts[t * k + j] * y[(t * k + j) * n_embd + c];
    x[i] += s;
}

// Router logits of a prompt: y[t, r] = W[r] . x'[t] for float32 rows in up to three segments of
// one row length (the router and, beside it, a shared expert's gate; MvSegs: y strides = their
// rows), x' = x * rsqrt(mean(x^2) + eps) * norm_w (norm_w NULL: x as it is). Float32 all the way:
// the tensor-core kernels round x to f16, which could flip a close top-k. The matrix-vector
// kernel ran these 512 tokens 4 at a time through blocks of 2 rows: 369 us a layer on the
// 30B-A3B shape, a quarter of its prefill. Tiles of RM_T tokens x RM_T rows, 128 threads of 2
// tokens x 4 rows each, K in steps of RM_KT through shared memory with the next step's loads in
// registers while this one is summed; the RMS scale (its sum of squares gathered from the same
// loads: a pass of its own over the block's 32 rows of x first was half the kernel's time) applied
// to the sums at the end. Grid
// (ceil(rows / RM_T), ceil(n_tok / RM_T), splits). K % (splits * RM_KT) == 0, x_stride % 4 == 0
// (host-checked).
// Splits > 1 (a prompt whose tiles do not fill the GPU: 32-64 blocks of 32 K steps each, latency
// bound): block z sums its K / splits slice into part (its tile's slab, RM_T x RM_T sums and RM_T
// sums of squares), and the tile's last block to finish adds the slabs in split order (the same
// result whichever finishes last) and writes y; counters (one per tile, zeroed) are left zeroed.
#define RM_T 32
#define RM_KT 64
#define RM_SLAB (RM_T * RM_T + RM_T)
extern "C" __global__ void __launch_bounds__(128) reflex_moe_router_mm(MvSegs segs, const float* x, int x_stride, int K,
                                                                       int n_tok, const float* norm_w, float eps,
                                                                       float* part, int* counters) {
    rx_pdl_begin();
    __shared__ __align__(16) float xs[RM_KT][RM_T + 2];  // [k][token]; +2 keeps float2 reads aligned, fewer conflicts
    __shared__ __align__(16) float ws[RM_KT][RM_T + 4];  // [k][row]; +4 keeps float4 reads aligned
    __shared__ float inv[RM_T];
    __shared__ int is_last;
    int tid = threadIdx.x;
    int r0 = blockIdx.x * RM_T, t0 = blockIdx.y * RM_T;
    int n0 = segs.rows[0], n1 = n0 + segs.rows[1], total = n1 + segs.rows[2];
    const int splits = gridDim.z, k_len = K / splits, k_first = blockIdx.z * k_len;
    // Loads: thread tid brings 16 consecutive k of row (and token) tid / 4.
    int lr = tid >> 2, lk = (tid & 3) * 16;
    int wr = r0 + lr, xt = t0 + lr;
    const float* wrow = nullptr;
    if (wr < total) {
        // constant indices only: a dynamic one would copy segs to local memory
        const uint8_t* base = wr < n0 ? segs.w[0] : wr < n1 ? segs.w[1] : segs.w[2];
        wrow = reinterpret_cast<const float*>(base) + (long)(wr - (wr < n0 ? 0 : wr < n1 ? n0 : n1)) * K + k_first;
    }
    const float* xrow = xt < n_tok ? x + (long)xt * x_stride + k_first : nullptr;
    if (norm_w) norm_w += k_first;
    float4 wv[4], xv[4];
    float ss = 0.f;  // this thread's share of its token's sum of squares (the 4 threads of a token cover K)
    auto fetch = [&](int k0) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int k = k0 + lk + 4 * i;
            wv[i] = wrow ? *reinterpret_cast<const float4*>(wrow + k) : make_float4(0.f, 0.f, 0.f, 0.f);
            xv[i] = xrow ? *reinterpret_cast<const float4*>(xrow + k) : make_float4(0.f, 0.f, 0.f, 0.f);
            if (norm_w) {
                ss += xv[i].x * xv[i].x + xv[i].y * xv[i].y + xv[i].z * xv[i].z + xv[i].w * xv[i].w;
                float4 n = *reinterpret_cast<const float4*>(norm_w + k);
                xv[i].x *= n.x, xv[i].y *= n.y, xv[i].z *= n.z, xv[i].w *= n.w;
            }
        }
    };
    int ty = tid >> 3, tx = tid & 7;  // sums: tokens 2 ty, 2 ty + 1; rows 4 tx .. 4 tx + 3
    float acc[2][4] = {};
    fetch(0);
    for (int k0 = 0; k0 < k_len; k0 += RM_KT) {
        __syncthreads();  // the previous step's tiles are read
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int k = lk + 4 * i;
            ws[k][lr] = wv[i].x, ws[k + 1][lr] = wv[i].y, ws[k + 2][lr] = wv[i].z, ws[k + 3][lr] = wv[i].w;
            xs[k][lr] = xv[i].x, xs[k + 1][lr] = xv[i].y, xs[k + 2][lr] = xv[i].z, xs[k + 3][lr] = xv[i].w;
        }
        __syncthreads();
        if (k0 + RM_KT < k_len) fetch(k0 + RM_KT);  // in flight while this step is summed
#pragma unroll 8
        for (int k = 0; k < RM_KT; k++) {
            float2 a = *reinterpret_cast<const float2*>(&xs[k][2 * ty]);
            float4 b = *reinterpret_cast<const float4*>(&ws[k][4 * tx]);
            acc[0][0] += a.x * b.x, acc[0][1] += a.x * b.y, acc[0][2] += a.x * b.z, acc[0][3] += a.x * b.w;
            acc[1][0] += a.y * b.x, acc[1][1] += a.y * b.y, acc[1][2] += a.y * b.z, acc[1][3] += a.y * b.w;
        }
    }
    ss += __shfl_xor_sync(0xffffffffu, ss, 1);
    ss += __shfl_xor_sync(0xffffffffu, ss, 2);
    if (splits > 1) {  // this slice's sums to the tile's slab; the last block of the tile adds them up
        const long tile = (long)blockIdx.y * gridDim.x + blockIdx.x;
        float* mine = part + (tile * splits + blockIdx.z) * RM_SLAB;
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) mine[(2 * ty + i) * RM_T + 4 * tx + j] = acc[i][j];
        if ((tid & 3) == 0) mine[RM_T * RM_T + lr] = ss;
        if (!split_last(counters + tile, splits, is_last, BlockSync{})) return;
        const float* slabs = part + tile * splits * RM_SLAB;
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float v = 0.f;
                for (int z = 0; z < splits; z++) v += __ldcg(slabs + z * RM_SLAB + (2 * ty + i) * RM_T + 4 * tx + j);
                acc[i][j] = v;
            }
        if ((tid & 3) == 0) {
            float v = 0.f;
            for (int z = 0; z < splits; z++) v += __ldcg(slabs + z * RM_SLAB + RM_T * RM_T + lr);
            ss = v;
        }
        if (tid == 0) counters[tile] = 0;  // every block of the tile has counted: ready for the next launch
    }
    if ((tid & 3) == 0) inv[lr] = norm_w ? rsqrtf(ss / K + eps) : 1.f;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int t = t0 + 2 * ty + i;
        if (t >= n_tok) continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int r = r0 + 4 * tx + j;
            if (r >= total) continue;
            float* y = r < n0 ? segs.y[0] : r < n1 ? segs.y[1] : segs.y[2];
            int stride = r < n0 ? segs.rows[0] : r < n1 ? segs.rows[1] : segs.rows[2];
            y[(long)t * stride + (r - (r < n0 ? 0 : r < n1 ? n0 : n1))] = acc[i][j] * inv[2 * ty + i];
        }
    }
}
