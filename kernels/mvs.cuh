// mvs.cuh: mvs.cu's staged one-token pieces (x in registers, rows from shared memory, the fused
// greedy pick, the gate/up body), shared with moe_decode.cu. What they compute is described in mvs.cu.
#pragma once

#include "matvec.cuh"  // MvSegs
#include "attn_plan.cuh"  // MvsMerge plans as the decode attention
#include "mvs_decode.cuh"
#include "stage_run.cuh"  // rx_stage
#include "state.cuh"

#define MVS_THREADS 256
#define MVS_WARPS 8
#define MVS_NX 4  // groups of 8 inputs per lane

// Lane layout: a lane holds MVS_NX groups of 8 inputs, in runs of RL consecutive groups. Types
// with a fast decoder below take whole 32-weight blocks per lane (RL = 4: one scale per block);
// the rest use dequant8 on groups 32 apart (RL = 1). Either way a warp part covers 32 * MVS_NX
// groups, so the host's choice of wpr does not depend on the type.
template <int T> struct MvsRun { static constexpr int RL = (T == RX_Q8_0 || T == RX_Q4_K || T == RX_Q6_K) ? 4 : 1; };

template <int RL>
__device__ __forceinline__ int mvs_group(int lane, int part, int wpr, int i) {
    return RL * (lane + 32 * (part + wpr * (i / RL))) + i % RL;
}

// The norm weights of this lane's groups (ones without a norm). They are weights: a kernel reads
// them before it waits for its predecessor, so they are not a second round trip after it.
template <int RL>
__device__ __forceinline__ void mvs_load_nw(const float* norm_w, int K, int part, int wpr, float (&nw)[MVS_NX][8]) {
    int lane = threadIdx.x & 31, ng = K >> 3;
#pragma unroll
    for (int i = 0; i < MVS_NX; i++) {
        int g = mvs_group<RL>(lane, part, wpr, i);
        float4 a = make_float4(1.f, 1.f, 1.f, 1.f), b = a;
        if (norm_w && g < ng) {
            a = reinterpret_cast<const float4*>(norm_w + 8 * g)[0];
            b = reinterpret_cast<const float4*>(norm_w + 8 * g)[1];
        }
        nw[i][0] = a.x, nw[i][1] = a.y, nw[i][2] = a.z, nw[i][3] = a.w;
        nw[i][4] = b.x, nw[i][5] = b.y, nw[i][6] = b.z, nw[i][7] = b.w;
    }
}

// One lane's x': MVS_NX groups of 8 floats and each group's sum, and for the integer-dot types
// (RL == 4: the lane's groups are one 32-input unit) the same inputs as int16 (mvs_decode.cuh's
// MvsQ). What a kernel's type does not use, the compiler drops.
struct MvsX {
    float r[MVS_NX][8];
    float s[MVS_NX];
    MvsQ q;
};

// x' for this lane's groups, in registers (zeros past K), and each group's sum (for K-quant
// minimums); with RL == 4 also quantized (mvs_quant32). With `norm`, warps 0 .. wpr-1 (which together hold every group once) reduce sum(x^2)
// for the block and x' = x * rsqrt(mean + eps) * nw. Every thread must call it. x may point to
// global or shared memory.
template <int RL>
__device__ __forceinline__ void mvs_load_x(const float* x, int K, bool norm, const float (&nw)[MVS_NX][8], float eps,
                                           int part, int wpr, MvsX& out, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, ng = K >> 3;
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < MVS_NX; i++) {
        int g = mvs_group<RL>(lane, part, wpr, i);
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
        if (g < ng) {
            a = reinterpret_cast<const float4*>(x + 8 * g)[0];
            b = reinterpret_cast<const float4*>(x + 8 * g)[1];
        }
        float* xr = out.r[i];
        xr[0] = a.x, xr[1] = a.y, xr[2] = a.z, xr[3] = a.w;
        xr[4] = b.x, xr[5] = b.y, xr[6] = b.z, xr[7] = b.w;
        ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w + b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
    }
    float inv = 1.f;
    if (norm) {
        ss = warp_sum(ss);
        if (lane == 0 && warp < wpr) scratch[warp] = ss;
        __syncthreads();
        float tot = 0.f;
        for (int w = 0; w < wpr; w++) tot += scratch[w];
        inv = rsqrtf(tot / K + eps);
    }
#pragma unroll
    for (int i = 0; i < MVS_NX; i++) {
        float* xr = out.r[i];
#pragma unroll
        for (int j = 0; j < 8; j++) xr[j] *= inv * nw[i][j];
        out.s[i] = ((xr[0] + xr[1]) + (xr[2] + xr[3])) + ((xr[4] + xr[5]) + (xr[6] + xr[7]));
    }
    if constexpr (RL == 4) mvs_quant32(&out.r[0][0], (out.s[0] + out.s[1]) + (out.s[2] + out.s[3]), &out.q);
}

// A post-norm folded into the next matrix kernel (Gemma's sandwich norms): the launch's x is the
// residual r, and its input is r + norm(src) * w (norm(v) = v / sqrt(mean(v^2) + eps)), made by every
// block from the previous block's output src; block (0, 0) also writes it to x_out, the residual
// the next post-norm adds to (the host alternates two buffers: other blocks still read r). src NULL:
// none. Saves the norm kernel (reflex_rmsnorm) between the two.
struct MvsPost {
    const float* src;
    const float* w;
    float* x_out;
    float eps;
};

// r + norm(src) * w into shared memory after `used` bytes (the host's xs_bytes(K) of room), and
// from block (0, 0) into post.x_out; returns the copy. Every thread must call it. The formula is
// reflex_rmsnorm's (kernels/norm.cuh rx_rmsnorm_row); its sum of squares adds in another order.
// Not inlined: the staged kernels keep their registers (94 -> 128 inlined), and the struct goes by value.
__device__ __noinline__ const float* mvs_post_x(const float* r, int K, long used, MvsPost post) {
    __shared__ float pscr[32];
    float4* xs = reinterpret_cast<float4*>(rx_dyn_smem + ((used + 15) & ~15L));
    const float4 *s4 = reinterpret_cast<const float4*>(post.src), *r4 = reinterpret_cast<const float4*>(r),
                 *w4 = reinterpret_cast<const float4*>(post.w);
    int n4 = K >> 2, t = threadIdx.x;
    float4 r0 = make_float4(0.f, 0.f, 0.f, 0.f), w0 = r0;
    if (t < n4) r0 = r4[t], w0 = w4[t];  // issued with src: one round trip for K <= 1024
    float ss = 0.f;
    for (int c = t; c < n4; c += MVS_THREADS) {
        float4 v = s4[c];
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        xs[c] = v;
    }
    float inv = rsqrtf(block_sum(ss, pscr) / K + post.eps);
    bool writer = blockIdx.x == 0 && blockIdx.y == 0;
    for (int c = t; c < n4; c += MVS_THREADS) {
        float4 v = xs[c], rr = c == t ? r0 : r4[c], ww = c == t ? w0 : w4[c], o;
        o.x = rr.x + v.x * inv * ww.x, o.y = rr.y + v.y * inv * ww.y;
        o.z = rr.z + v.z * inv * ww.z, o.w = rr.w + v.w * inv * ww.w;
        xs[c] = o;
        if (writer) reinterpret_cast<float4*>(post.x_out)[c] = o;
    }
    __syncthreads();
    return reinterpret_cast<const float*>(xs);
}

// The decode attention's slices merged here, by the kernel that reads its output (the output
// projection), instead of by the attention's last block (attn_decode.cuh, its `defer`): x is the
// attention output of one row, n_head * hd_v floats, made from the slices' partials (m, l, o) as
// attention.cuh split_merge makes it. The attention leaves a row of 2 .. defer slices unmerged; this
// kernel plans as it does (attn_plan.cuh) from the same device ints and launch numbers, read before
// its wait (the previous step's pick wrote them, launches ago, as the attention reads them early).
struct MvsMerge {
    const float *part_o, *part_ml;  // the attention's partials: head h's slice s at h * max_split + s
    const int *n_kv, *slot;        // its n_kv_ptr and q_slot
    int max_split, min_keys, n_hg, window, window_slots, hd_v, defer;
};

// The row's slices when the attention left them to this kernel, else 0 (x is its output), from its
// n_kv and slot. Their loads go first in the kernel, ahead of its weights' copies: an SM returns
// loads in order (results/2026-12-04-h200-s25), so behind a tile the choice between the two inputs,
// and then x, would wait for the whole tile. (The kernel is still ~1.6 us a launch slower than
// reflex_mvs_* on Qwen3-0.6B's 2,048-wide projection, merging or not: PERFORMANCE_NOTES, s33.)
__device__ __forceinline__ int mvs_merge_splits(const MvsMerge& m, int n_kv, int slot) {
    AtdPlan p = atd_plan(n_kv, slot, 0, m.window, m.window_slots, m.min_keys, m.max_split, m.n_hg);
    return atd_deferred(p.n_split, m.defer) ? p.n_split : 0;
}

// x (K floats) merged from n (2 .. ATD_DEFER_MAX) slices into xs (shared memory); every thread must
// call it. A thread takes a float4 of one head and issues all its slices' loads at once: one L2
// round trip. The weights' sum adds in warp_sum's order (lanes past n add zeros) and the slices in
// order: split_merge's numbers for n <= 4. Inlined, before the kernel's x is live, and in kernels
// without a pre-norm (its weights would be live too): 80 registers and no stack, where a
// __noinline__ call took 121 (or 96 and a 32-byte stack).
__device__ __forceinline__ void mvs_merge_x(int K, float4* xs, const MvsMerge& m, int n) {
    int n4 = K >> 2, c4s = m.hd_v >> 2;
    for (int c = threadIdx.x; c < n4; c += MVS_THREADS) {
        int h = c / c4s;
        const float* ml = m.part_ml + (long)h * m.max_split * 2;
        const float4* po = reinterpret_cast<const float4*>(m.part_o + (long)h * m.max_split * m.hd_v) + (c - h * c4s);
        float mm[ATD_DEFER_MAX], ll[ATD_DEFER_MAX];
        float4 v[ATD_DEFER_MAX];
#pragma unroll
        for (int s = 0; s < ATD_DEFER_MAX; s++) {
            mm[s] = s < n ? __ldcg(ml + 2 * s) : -INFINITY;
            ll[s] = s < n ? __ldcg(ml + 2 * s + 1) : 0.f;
            v[s] = s < n ? __ldcg(po + (long)s * c4s) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        float M = mm[0];
#pragma unroll
        for (int s = 1; s < ATD_DEFER_MAX; s++) M = fmaxf(M, mm[s]);
        auto e = [&](int s) { return mm[s] == -INFINITY ? 0.f : __expf(mm[s] - M); };  // a slice's weight
        auto d = [&](int s) { return ll[s] * e(s); };
        float den = ((d(0) + d(4)) + (d(2) + d(6))) + ((d(1) + d(5)) + (d(3) + d(7)));  // warp_sum's order
        float inv = den > 0.f ? 1.f / den : 0.f;
        float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int s = 0; s < ATD_DEFER_MAX; s++) {
            if (s >= n) break;
            float w = e(s) * inv;
            o.x += v[s].x * w, o.y += v[s].y * w, o.z += v[s].z * w, o.w += v[s].w * w;
        }
        xs[c] = o;
    }
}

// The input of a staged kernel: with POST (the reflex_mvs*_post kernels), mvs_post_x's copy of
// r + norm(src) * w; else x itself, the code of the kernels without it unchanged. Then x' in
// registers as mvs_load_x makes it.
template <int RL, bool POST>
__device__ __forceinline__ void mvs_load_input(const float* x, int K, long used, const MvsPost& post, bool norm,
                                               const float (&nw)[MVS_NX][8], float eps, int part, int wpr, MvsX& out,
                                               float* scratch) {
    if constexpr (POST) mvs_load_x<RL>(mvs_post_x(x, K, used, post), K, norm, nw, eps, part, wpr, out, scratch);
    else mvs_load_x<RL>(x, K, norm, nw, eps, part, wpr, out, scratch);
}

// x' with no norm (ones as norm weights).
template <int RL>
__device__ __forceinline__ void mvs_load_x_plain(const float* x, int K, int part, int wpr, MvsX& out) {
    float ones[MVS_NX][8];
#pragma unroll
    for (int i = 0; i < MVS_NX; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) ones[i][j] = 1.f;
    mvs_load_x<RL>(x, K, false, ones, 0.f, part, wpr, out, nullptr);
}

// dequant8, with the hardware half conversion for F16 (quant.cuh's portable one is bit arithmetic).
template <int T>
__device__ __forceinline__ void mvs_dequant8(const uint8_t* row, int g, float* w) {
    if constexpr (T == RX_F16) {
        uint4 v = *reinterpret_cast<const uint4*>(row + 16 * g);
        const half2* h = reinterpret_cast<const half2*>(&v);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 f = __half22float2(h[i]);
            w[2 * i] = f.x, w[2 * i + 1] = f.y;
        }
    } else {
        dequant8<T>(row, g, w);
    }
}

// This lane's share of dot(row, x'), the row's bytes in shared memory.
template <int T>
__device__ __forceinline__ float mvs_dot(const uint8_t* row, const MvsX& x, int lane, int part, int wpr, int ng) {
    constexpr int RL = MvsRun<T>::RL;
    if constexpr (RL == 4) {  // MVS_NX == 4: one 32-weight unit per lane
        int u = lane + 32 * part;
        if (4 * u >= ng) return 0.f;
        if constexpr (T == RX_Q8_0) return mvs_idot_q8_0(row, &x.q, u);
        else if constexpr (T == RX_Q4_K) return mvs_idot_q4_k(row, &x.q, u);
        else return mvs_idot_q6_k(row, &x.q, u);
    } else {
        float acc[MVS_NX];
#pragma unroll
        for (int i = 0; i < MVS_NX; i++) {
            acc[i] = 0.f;
            int g = mvs_group<RL>(lane, part, wpr, i);
            if (g < ng) {
                float w[8];
                mvs_dequant8<T>(row, g, w);
#pragma unroll
                for (int j = 0; j < 8; j++) acc[i] = fmaf(w[j], x.r[i][j], acc[i]);
            }
        }
        return (acc[0] + acc[1]) + (acc[2] + acc[3]);
    }
}

// Rows [0, n) of one staged range: part sums into red[(base + i) * wpr + part].
template <int T>
__device__ __forceinline__ void mvs_range(const uint8_t* srow, long row_bytes, int n, const MvsX& x, int ng, int wpr,
                                          float* red, int base) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int slots = MVS_WARPS / wpr, slot = warp / wpr, part = warp - slot * wpr;
    int i = slot;
    // integer dots: two rows at a time, so their loads, dots and shuffle reductions are independent
    // chains that interleave (one row's reduction, ~5 dependent shuffles, is as long as its dot);
    // the float decoders' dots are long enough alone (and twice their code would be large)
    if constexpr (MvsRun<T>::RL == 4) {
        for (; i + slots < n; i += 2 * slots) {
            float a = mvs_dot<T>(srow + (long)i * row_bytes, x, lane, part, wpr, ng);
            float b = mvs_dot<T>(srow + (long)(i + slots) * row_bytes, x, lane, part, wpr, ng);
            a = warp_sum(a), b = warp_sum(b);
            if (lane == 0) red[(base + i) * wpr + part] = a, red[(base + i + slots) * wpr + part] = b;
        }
    }
    for (; i < n; i += slots) {
        float a = warp_sum(mvs_dot<T>(srow + (long)i * row_bytes, x, lane, part, wpr, ng));
        if (lane == 0) red[(base + i) * wpr + part] = a;
    }
}

__device__ __forceinline__ float mvs_total(const float* red, int i, int wpr) {
    float v = 0.f;
    for (int p = 0; p < wpr; p++) v += red[i * wpr + p];
    return v;
}

// Block-wide argmax (rx_better order); thread 0 gets the winner.
__device__ __forceinline__ void mvs_block_argmax(float& bv, int& bi) {
    __shared__ float sv[MVS_WARPS];
    __shared__ int si[MVS_WARPS];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    rx_warp_argmax(bv, bi);
    __syncthreads();
    if (lane == 0) sv[warp] = bv, si[warp] = bi;
    __syncthreads();
    if (warp == 0) {
        bv = lane < MVS_WARPS ? sv[lane] : -INFINITY;
        bi = lane < MVS_WARPS ? si[lane] : 0x7fffffff;
        rx_warp_argmax(bv, bi);
    }
}

// The greedy pick fused into an LM head launch (part_v == NULL: none): block maxima, a zeroed
// counter the last block resets, and the decode state it advances (state.cuh).
struct MvsPick {
    float* part_v;
    int* part_i;
    int* counter;
    RxState st;
    int last;
};

// After a block wrote its logits: its argmax, and in the last block to finish, the pick.
__device__ void mvs_pick(const MvsPick& pick, float bv, int bi) {
    __shared__ int is_last;
    mvs_block_argmax(bv, bi);
    if (threadIdx.x == 0) pick.part_v[blockIdx.x] = bv, pick.part_i[blockIdx.x] = bi;
    __threadfence();  // the partial is visible before this block counts itself done
    __syncthreads();
    if (threadIdx.x == 0) is_last = atomicAdd(pick.counter, 1) == (int)gridDim.x - 1;
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    bv = -INFINITY, bi = 0x7fffffff;
    for (int i = threadIdx.x; i < (int)gridDim.x; i += MVS_THREADS) {
        float v = __ldcg(pick.part_v + i);
        int id = __ldcg(pick.part_i + i);
        if (rx_better(v, id, bv, bi)) bv = v, bi = id;
    }
    mvs_block_argmax(bv, bi);
    if (threadIdx.x == 0) {
        rx_advance(pick.st, pick.last, bi == 0x7fffffff ? 0 : bi);
        *pick.counter = 0;  // ready for the next replay
    }
}

// y[r0 + i] (+)= dot for rows r0 .. r0 + rb of one matrix (the block's share of its segment).
// POST: the input is r + norm(post.src) * post.w (mvs_post_x), made after `x_row_bytes` rows of
// staged weights and the row sums (reflex_mvs_mixed_post: the largest segment's rows, as the host planned).
// MERGE (reflex_mvs_merge_*): x is the decode attention's output, merged here from its slices when
// it left them (mvs_merge_x) in the same room.
template <int T, bool POST, bool MERGE = false>
__device__ void mvs_seg_body(const uint8_t* w, float* y, int rows, long row_bytes, int b, const float* x, int K, int rb,
                             int wpr, int accumulate, const float* norm_w, float eps, const MvsPick& pick,
                             const MvsPost& post, long x_row_bytes, const MvsMerge& merge = MvsMerge{}) {
    __shared__ float scratch[MVS_WARPS];
    int r0 = b * rb, n = min(rb, rows - r0);  // the host sizes the grid: n >= 1
    int n_kv = 0, slot = 0;
    if constexpr (MERGE) n_kv = *merge.n_kv, slot = *merge.slot;  // before the weights (mvs_merge_splits)
    long span = rx_stage_bytes((long)rb * row_bytes);
    const uint8_t* srow = rx_stage(rx_dyn_smem, w + (long)r0 * row_bytes, (long)n * row_bytes);
    rx_cp_commit();
    constexpr int RL = MvsRun<T>::RL;
    int part = (threadIdx.x >> 5) % wpr;
    float nw[MVS_NX][8];
    MvsX xin;
    float prev = 0.f;
    long used = rx_stage_bytes((long)rb * x_row_bytes) + 4L * rb * wpr;
    if constexpr (MERGE) {  // no pre-norm here (the host's promise): x' = x
        int n_merge = mvs_merge_splits(merge, n_kv, slot);
        rx_pdl_begin();  // weights are in flight; x comes from the predecessor
        prev = accumulate && (int)threadIdx.x < n ? y[r0 + threadIdx.x] : 0.f;  // issued now, used last
        if (n_merge) {
            float4* xs = reinterpret_cast<float4*>(rx_dyn_smem + ((used + 15) & ~15L));
            mvs_merge_x(K, xs, merge, n_merge);
            __syncthreads();
            mvs_load_x_plain<RL>(reinterpret_cast<const float*>(xs), K, part, wpr, xin);
        } else {
            mvs_load_x_plain<RL>(x, K, part, wpr, xin);
        }
    } else {
        mvs_load_nw<RL>(norm_w, K, part, wpr, nw);
        rx_pdl_begin();  // weights are in flight; x comes from the predecessor
        prev = accumulate && (int)threadIdx.x < n ? y[r0 + threadIdx.x] : 0.f;  // issued now, used last
        mvs_load_input<RL, POST>(x, K, used, post, norm_w != nullptr, nw, eps, part, wpr, xin, scratch);
    }
    rx_cp_wait_all();
    __syncthreads();
    float* red = reinterpret_cast<float*>(rx_dyn_smem + span);
    mvs_range<T>(srow, row_bytes, n, xin, K >> 3, wpr, red, 0);
    __syncthreads();
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += MVS_THREADS) {
        float v = mvs_total(red, i, wpr);
        if (accumulate) v += i == (int)threadIdx.x ? prev : y[r0 + i];
        y[r0 + i] = v;
        if (v != v) v = -INFINITY;  // NaN never wins
        if (rx_better(v, r0 + i, bv, bi)) bv = v, bi = r0 + i;
    }
    if (pick.part_v) mvs_pick(pick, bv, bi);
}

// The LM head streamed (reflex_mvs_head_*): block b owns rows [b rpb, (b + 1) rpb) and walks them in
// chunks of `chunk` rows through a ring of MVS_STAGES shared-memory slots, MVS_STAGES - 1 chunks
// in flight while one is computed (the first ones issued before the wait). One block per SM or
// two stay resident for the whole matrix, so an SM always has copies in flight; mvs_seg_body's
// blocks issue theirs only when they start, in waves. Same outputs and pick as mvs_seg_body.
#define MVS_STAGES 4
template <int T>
__device__ void mvs_stream_body(const uint8_t* w, float* y, int rows, long row_bytes, const float* x, int K, int rpb,
                                int chunk, int wpr, const float* norm_w, float eps, const MvsPick& pick) {
    __shared__ float scratch[MVS_WARPS];
    int r_begin = blockIdx.x * rpb, r_end = min(rows, r_begin + rpb);  // the host sizes the grid: non-empty
    int n_chunks = (r_end - r_begin + chunk - 1) / chunk;
    long span = rx_stage_bytes((long)chunk * row_bytes);
    float* red = reinterpret_cast<float*>(rx_dyn_smem + MVS_STAGES * span);
    auto issue = [&](int c) {  // chunk c into slot c % MVS_STAGES; a group per chunk, empty past the end
        if (c < n_chunks) {
            int r0 = r_begin + c * chunk;
            rx_stage(rx_dyn_smem + (c % MVS_STAGES) * span, w + (long)r0 * row_bytes,
                     (long)min(chunk, r_end - r0) * row_bytes);
        }
        rx_cp_commit();
    };
    for (int c = 0; c < MVS_STAGES - 1; c++) issue(c);
    constexpr int RL = MvsRun<T>::RL;
    int part = (threadIdx.x >> 5) % wpr;
    float nw[MVS_NX][8];
    MvsX xin;
    mvs_load_nw<RL>(norm_w, K, part, wpr, nw);
    rx_pdl_begin();  // the first chunks are in flight; x comes from the predecessor
    mvs_load_x<RL>(x, K, norm_w != nullptr, nw, eps, part, wpr, xin, scratch);
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int c = 0; c < n_chunks; c++) {
        issue(c + MVS_STAGES - 1);  // into the slot chunk c - 1 left (the loop's last barrier freed it)
        rx_cp_wait_prior<MVS_STAGES - 1>();  // chunk c has landed (this thread's copies)
        __syncthreads();                      // ... everyone's
        int r0 = r_begin + c * chunk, n = min(chunk, r_end - r0);
        uintptr_t src = reinterpret_cast<uintptr_t>(w + (long)r0 * row_bytes);
        const uint8_t* srow = rx_dyn_smem + (c % MVS_STAGES) * span + (src & 15);  // where rx_stage put it
        mvs_range<T>(srow, row_bytes, n, xin, K >> 3, wpr, red, 0);
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += MVS_THREADS) {
            float v = mvs_total(red, i, wpr);
            y[r0 + i] = v;
            if (v != v) v = -INFINITY;  // NaN never wins
            if (rx_better(v, r0 + i, bv, bi)) bv = v, bi = r0 + i;
        }
        __syncthreads();  // red and the chunk's slot are free again
    }
    if (pick.part_v) mvs_pick(pick, bv, bi);
}

// Up to three matrices of any weight types sharing x and K (q, k, v of a Q4_K_M file, whose v is
// Q6_K): each block runs the typed body of its segment's type.
struct MvSegsMixed {
    const uint8_t* w[3];
    float* y[3];
    long row_bytes[3];
    int rows[3];
    int type[3];
};

// Which segment block blockIdx.x belongs to (segment s has ceil(rows_s / rb) blocks), and its
// index inside it. Constant indices only: a dynamic one would copy the struct to local memory.
template <class Segs>
__device__ __forceinline__ int mvs_segment(const Segs& segs, int rb, int* b) {
    int nb0 = (segs.rows[0] + rb - 1) / rb, nb1 = (segs.rows[1] + rb - 1) / rb;
    *b = blockIdx.x;
    if (*b < nb0) return 0;
    *b -= nb0;
    if (*b < nb1) return 1;
    *b -= nb1;
    return 2;
}

// act(gate) * up for rows r0 .. r0 + rb; with ids, of the expert routed to slot blockIdx.y (its
// rows start expert_bytes apart in the stacked tensors), staged after the wait that makes the
// ids visible; dense weights are staged before it. With ids and Sg / Su (a shared expert of the
// experts' type and size), the last slot (blockIdx.y = k) is the shared expert's, staged early.
template <int T, bool POST>
__device__ void mvs_glu_body(const uint8_t* Wg, const uint8_t* Wu, long row_bytes, long expert_bytes, const int* ids,
                             const float* x, const float* norm_w, float eps, float* y, int n_rows, int K, int rb,
                             int wpr, int act, const uint8_t* Sg, const uint8_t* Su, const MvsPost& post) {
    __shared__ float scratch[MVS_WARPS];
    int s = blockIdx.y, r0 = blockIdx.x * rb, n = min(rb, n_rows - r0);
    long span = rx_stage_bytes((long)rb * row_bytes);
    bool routed = ids && !(Sg && s == (int)gridDim.y - 1);
    const uint8_t *sg = nullptr, *su = nullptr;
    if (!routed) {
        sg = rx_stage(rx_dyn_smem, (ids ? Sg : Wg) + (long)r0 * row_bytes, (long)n * row_bytes);
        su = rx_stage(rx_dyn_smem + span, (ids ? Su : Wu) + (long)r0 * row_bytes, (long)n * row_bytes);
    }
    constexpr int RL = MvsRun<T>::RL;
    int part = (threadIdx.x >> 5) % wpr;
    float nw[MVS_NX][8];
    MvsX xin;
    mvs_load_nw<RL>(norm_w, K, part, wpr, nw);
    rx_pdl_begin();
    if (routed) {
        long off = (long)ids[s] * expert_bytes + (long)r0 * row_bytes;
        sg = rx_stage(rx_dyn_smem, Wg + off, (long)n * row_bytes);
        su = rx_stage(rx_dyn_smem + span, Wu + off, (long)n * row_bytes);
    }
    rx_cp_commit();
    mvs_load_input<RL, POST>(x, K, 2 * span + 8L * rb * wpr, post, norm_w != nullptr, nw, eps, part, wpr, xin, scratch);
    rx_cp_wait_all();
    __syncthreads();
    float* red = reinterpret_cast<float*>(rx_dyn_smem + 2 * span);
    mvs_range<T>(sg, row_bytes, n, xin, K >> 3, wpr, red, 0);
    mvs_range<T>(su, row_bytes, n, xin, K >> 3, wpr, red, rb);
    __syncthreads();
    float* out = y + (long)s * n_rows + r0;
    for (int i = threadIdx.x; i < n; i += MVS_THREADS)
        out[i] = rx_act(mvs_total(red, i, wpr), act) * mvs_total(red, rb + i, wpr);
}
