// attn_decode.cuh: the body of attn_decode.cu's kernel (described there), as a device function
// that reflex_fused_step (fused_step.cu) runs too.
#pragma once

#include "attention.cuh"  // split_merge_done
#include "attn_plan.cuh"
#include "attn_decode_args.cuh"
#include "mma_ops.cuh"  // the tensor-core kernels' rx_mma, rx_movt
#include "stage.cuh"

#define ATD_THREADS 128
#define ATD_TILE 32
#define ATD_MAXG 16
#define ATD_MAXSPLIT 128  // a multiple of 32
#define ATD_ITEMS 8  // (head, 4 dims) items per thread: G * hd_v / 4 <= 1024
#define ATD_PAD 64    // bytes after each K / V row in shared memory
#define ATD_MERGE 16  // slices merged by one block (a run); ATD_MAXSPLIT / ATD_MERGE runs <= 32
#define ATD_COUNTERS (1 + ATD_MAXSPLIT / ATD_MERGE)  // per (row, KV head, head group): the top one, one per run

// Which 16-byte chunk of which rows this thread copies (atd_stage): chunk c of every per-th row
// from row r, for rows of 2 * hd bytes (hd / 8 chunks). Made once per kernel: no division per copy.
struct AtdLane {
    int r, c, per;
    __device__ __forceinline__ AtdLane(int hd) {
        int nc = hd / 8;
        per = ATD_THREADS / nc, r = threadIdx.x / nc, c = threadIdx.x - r * nc;
    }
};

// Start copying the K and V rows of keys [ja, jb) into tile slots j - t0. Rows are padded by 64
// bytes in shared memory: a quarter warp then reads 4 chunks of each of 2 keys from 8 different
// groups of banks.
__device__ __forceinline__ void atd_stage_rows(uint8_t* t, const half* base, int ja, int jb, int t0, int hd,
                                               AtdLane l, const int* blocks) {
    if (l.r >= l.per) return;
    for (int j = ja + l.r; j < jb; j += l.per)
        rx_cp16(t + (j - t0) * (2 * hd + ATD_PAD) + 16 * l.c, base + rx_kv_row(blocks, j) * hd + 8 * l.c);
}

struct AtdStager {
    const half *kbase, *vbase;
    int hd, hd_v;
    AtdLane lk, lv;
    const int* blocks;
    __device__ __forceinline__ void operator()(uint8_t* kt, uint8_t* vt, int ja, int jb, int t0) const {
        atd_stage_rows(kt, kbase, ja, jb, t0, hd, lk, blocks);
        atd_stage_rows(vt, vbase, ja, jb, t0, hd_v, lv, blocks);
    }
};

// cos / sin of the rope_dim / 2 angles at position pos: angle_i = pos * theta_i / factors_i in
// double (theta: the host's table), reduced to [-pi, pi] in double, then sincosf. As exact as
// rope.cu's double pow / sincos to float rounding, without their instructions and constants on
// the kernel's path.
__device__ void atd_angles(const AtdRope& r, int pos, float2* cs) {
    for (int i = threadIdx.x; i < r.rope_dim / 2; i += ATD_THREADS) {
        double a = (double)pos * __ldg(r.theta + i);
        if (r.factors) a /= (double)r.factors[i];
        double k = rint(a * 0.15915494309189535);                      // a / (2 pi)
        double red = fma(-k, 2.4492935982947064e-16, fma(-k, 6.283185307179586, a));  // 2 pi = hi + lo
        float sn, cn;
        sincosf((float)red, &sn, &cn);
        cs[i] = make_float2(cn, sn);
    }
}

// One warp: head h (hd floats in shared memory) RMS-normalized with nw (if given), then rotated.
__device__ void atd_rope_head(float* h, int hd, const float* nw, const AtdRope& r, const float2* cs) {
    int lane = threadIdx.x & 31;
    if (nw) {
        float ss = 0.f;
        for (int d = lane; d < hd; d += 32) ss += h[d] * h[d];
        float scale = rsqrtf(warp_sum(ss) / hd + r.eps);
        for (int d = lane; d < hd; d += 32) h[d] *= scale * nw[d];
        __syncwarp();
    }
    int half_dim = r.rope_dim / 2;
    for (int i = lane; i < half_dim; i += 32) {
        int a = r.mode == 1 ? 2 * i : i, b = r.mode == 1 ? 2 * i + 1 : i + half_dim;
        float x0 = h[a], x1 = h[b], c = cs[i].x, sn = cs[i].y;
        h[a] = x0 * c - x1 * sn;
        h[b] = x0 * sn + x1 * c;
    }
    __syncwarp();
}

__device__ __forceinline__ void atd_h8(uint4 raw, float* f) {
    const half2* h = reinterpret_cast<const half2*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 v = __half22float2(h[i]);
        f[2 * i] = v.x, f[2 * i + 1] = v.y;
    }
}

// The block's barrier: named barrier 1 of the ATD_THREADS threads that run atd_body (a block of
// reflex_fused_step has more threads; they do not take part).
__device__ __forceinline__ void atd_sync() { asm volatile("bar.sync 1, %0;" ::"n"(ATD_THREADS) : "memory"); }

struct AtdSync {  // split_merge's barrier: atd_sync
    __device__ __forceinline__ void operator()() const { atd_sync(); }
};

// What atd_body waits for between what it may read early (with `prefetch`) and the rest: the
// predecessor kernel (reflex_attn_decode); fused_step.cu passes its grid barrier instead.
struct AtdPdlWait {
    __device__ __forceinline__ void operator()() const { rx_pdl_begin(); }
};

// ---- The tensor-core kernels (reflex_attn_decode_t2 / _t4 / _t8: G <= 8, hd and hd_v <= 128, sm_80+) ----
// Each warp walks its own keys, 16 at a time (warp w: keys j0 + 16 w, + 64, ...), loads them from
// global memory straight into registers, scores them and folds them into its own running softmax
// with mma.sync; the four warps merge once at the end, so the loop has no block barrier and a few
// tens of warp instructions a key against the tile loop's ~128 (PERFORMANCE_NOTES s35).
// Both products run on 16-row tiles of which the block's heads fill rows 0..7: rows 8..15 carry
// what rounding to f16 left of q (and of p), so hi + lo keep ~22 bits (a lo under 2^-14 is an f16
// subnormal: |q| below ~2^-3 keeps an absolute 2^-25; a |q| past 65504 would overflow, which the f32
// tile loop would not), well inside the tests' 2e-4 of float64. Lane (g = lane / 4, t = lane % 4)
// loads 16 bytes of each of keys kb + g and kb + 8 + g: dims 32 dg + 8 t .. + 7 of dim group dg,
// the order the scores' k-steps take the dims in (q's fragment is loaded in the same order). For
// P V, movmatrix turns those key-major registers into operands paired along the keys; the
// product's lane then holds dims 32 dg + 8 t .. + 7 of head g.
#define ATD_TC_WARPS (ATD_THREADS / 32)
#define ATD_TC_KEYS 16  // keys a warp takes at a time: one k-step of P V, two 8-key tiles of scores
#define ATD_TC_DG 4     // 32-dim groups of a row: hd, hd_v <= 128

// (x0, x1) as the f16 pair hi and the f16 pair lo of what hi leaves: hi + lo = x to ~2^-22
__device__ __forceinline__ void atd_split_h2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
    hi = rx_pack_h2(x0, x1);
    float2 f = __half22float2(*reinterpret_cast<const half2*>(&hi));
    lo = rx_pack_h2(x0 - f.x, x1 - f.y);
}

// 2^x, flushing results below 2^-126 to zero: one instruction, where __expf adds a range check
__device__ __forceinline__ float atd_ex2(float x) {
#ifdef __CUDA_ARCH__
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else
    return exp2f(x);
#endif
}

// Row j's first element in a cache of rows `width` wide, the offset in 32 bits (the host checks that
// n_rows * width fits): one multiply, where a 64-bit product costs three an address.
__device__ __forceinline__ const half* atd_row(const half* base, const int* blocks, int j, int width) {
    return base + (unsigned)((int)rx_kv_row(blocks, j) * width);
}

// The K and V lines of the warp's 16 keys from kb (not slot jn) into L2, two a lane: with `prefetch`
// the first group's before the wait, and in the loop the next group's.
__device__ __forceinline__ void atd_tc_prefetch(const half* kbase, const half* vbase, int hd, int hd_v,
                                                const int* blocks, int kb, int j1, int jn) {
    // rows of <= 256 bytes (hd, hd_v <= 128): lane (g, t) takes line t / 2 of key kb + 8 (t % 2) + g's K and V rows
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, j = kb + 8 * (t & 1) + g, b = 128 * (t >> 1);
    if (j >= j1 || j == jn) return;
    if (b < 2 * hd) rx_prefetch_l2(reinterpret_cast<const char*>(atd_row(kbase, blocks, j, hd)) + b);
    if (b < 2 * hd_v) rx_prefetch_l2(reinterpret_cast<const char*>(atd_row(vbase, blocks, j, hd_v)) + b);
}

// Keys [j0, j1) against the G heads of qs (f32, pre-scaled): each thread's (head, 4 dims) items in
// acc and the block's running max and sum in m_run / l_run, as the tile loop leaves them. knew:
// with a fused rope, the new key (f16, knew[0..hd)) and value (knew[256..)) of slot jn, read from
// there. scratch: the tiles' room (qs and S not touched), 256 + 16 G hd_v + 4 warps x 1,024 hd / 32
// bytes: the warps' maxima and sums, their output rows, and each warp's copy of q's fragments
// (attn_decode.py tc_scratch_bytes; the host checks it fits).
template <int MG, int NI>
__device__ __forceinline__ void atd_tc_keys(const float* qs, int G, int hd, int hd_v, const half* kbase,
                                            const half* vbase, const int* blocks, int j0, int j1, int jn,
                                            const half* knew, int window, int my_pos, const int* kv_pos,
                                            float softcap, float* scratch, float* m_run, float* l_run,
                                            float (&acc)[NI][4]) {
    static_assert(MG <= 8, "the heads fill rows 0..7 of the products' tiles");
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    int ndk = hd / 32, ndv = hd_v / 32;
    // q as the A operand, one uint4 a lane and k-step (dg, u): hi, lo of dims 32 dg + 8 t + 4 u, + 1; hi, lo of
    // + 2, + 3 (rows 8..15 the lo halves). Kept in shared memory (a copy a warp): registers go to the keys.
    uint4* qf = reinterpret_cast<uint4*>(scratch + 64 + 4 * G * hd_v) + warp * ndk * 2 * 32;  // ndk * 1 KB a warp
    for (int dg = 0; dg < ndk; dg++) {
        const float4* qp = reinterpret_cast<const float4*>(qs + g * hd + 32 * dg + 8 * t);
        float4 a = g < G ? qp[0] : make_float4(0.f, 0.f, 0.f, 0.f), b = g < G ? qp[1] : make_float4(0.f, 0.f, 0.f, 0.f);
        uint4 f0, f1;
        atd_split_h2(a.x, a.y, f0.x, f0.y);
        atd_split_h2(a.z, a.w, f0.z, f0.w);
        atd_split_h2(b.x, b.y, f1.x, f1.y);
        atd_split_h2(b.z, b.w, f1.z, f1.w);
        qf[(2 * dg) * 32 + lane] = f0, qf[(2 * dg + 1) * 32 + lane] = f1;
    }
    __syncwarp();
    float o[ATD_TC_DG][4][4];  // [dg][r]: head g's dims 32 dg + 8 t + 2 r, + 1 from p's hi rows, then its lo rows
#pragma unroll
    for (int dg = 0; dg < ATD_TC_DG; dg++)
#pragma unroll
        for (int r = 0; r < 4; r++) o[dg][r][0] = o[dg][r][1] = o[dg][r][2] = o[dg][r][3] = 0.f;
    float m = -INFINITY, l = 0.f;  // head g's running max, and this lane's share of the sum
    // Each group's loads, then its work: loading the next group's K and V behind this one's (a416092) was
    // 2-4% slower at 4,096-16,384 keys on an H100 (s37), with the L2 prefetch below already one group ahead.
    for (int kb = j0 + ATD_TC_KEYS * warp; kb < j1; kb += ATD_TC_KEYS * ATD_TC_WARPS) {
        // the warp's next keys into L2 meanwhile: its loads there wait on L2, not on DRAM
        atd_tc_prefetch(kbase, vbase, hd, hd_v, blocks, kb + ATD_TC_KEYS * ATD_TC_WARPS, j1, knew ? jn : -1);
        const half* kp[2];
        const half* vp[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {  // past j1: the last key again (masked below), a row that holds numbers
            int j = min(kb + 8 * h + g, j1 - 1);
            if (knew && j == jn) {
                kp[h] = knew, vp[h] = knew + 256;
            } else {
                kp[h] = atd_row(kbase, blocks, j, hd), vp[h] = atd_row(vbase, blocks, j, hd_v);
            }
        }
        uint4 kr[2][ATD_TC_DG], vr[2][ATD_TC_DG];
#pragma unroll
        for (int dg = 0; dg < ATD_TC_DG; dg++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if (dg < ndk) kr[h][dg] = *reinterpret_cast<const uint4*>(kp[h] + 32 * dg + 8 * t);
                if (dg < ndv) vr[h][dg] = *reinterpret_cast<const uint4*>(vp[h] + 32 * dg + 8 * t);
            }
        float sc[4];  // head g against keys kb + 2t, + 1 (h = 0) and kb + 8 + 2t, + 1 (h = 1)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int dg = 0; dg < ATD_TC_DG; dg++) {
                if (dg >= ndk) break;
                uint4 a = qf[(2 * dg) * 32 + lane], b = qf[(2 * dg + 1) * 32 + lane];
                rx_mma(s, a.x, a.y, a.z, a.w, kr[h][dg].x, kr[h][dg].y);
                rx_mma(s, b.x, b.y, b.z, b.w, kr[h][dg].z, kr[h][dg].w);
            }
            sc[2 * h] = s[0] + s[2], sc[2 * h + 1] = s[1] + s[3];  // the hi rows' sum plus the lo rows'
        }
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int j = kb + 8 * (i >> 1) + 2 * t + (i & 1);
            // the new key's kv_pos may still be on its way (another block writes it): it is at my_pos
            bool ok = j < j1 && !(window > 0 && !(knew && j == jn) && my_pos - kv_pos[j] >= window);
            if (ok && softcap > 0.f) sc[i] = softcap * tanhf(sc[i] / softcap);
            sc[i] = ok ? sc[i] : -INFINITY;
            mx = fmaxf(mx, sc[i]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        float mn = fmaxf(m, mx), corr = 1.f, p[4] = {0.f, 0.f, 0.f, 0.f};
        if (mn != -INFINITY) {
            const float log2e = 1.4426950408889634f;
            corr = atd_ex2((m - mn) * log2e);
#pragma unroll
            for (int i = 0; i < 4; i++) p[i] = atd_ex2((sc[i] - mn) * log2e);
        }
        l = l * corr + (p[0] + p[1]) + (p[2] + p[3]);
        m = mn;
        if (!__all_sync(0xffffffffu, corr == 1.f)) {  // a new maximum somewhere in the warp
#pragma unroll
            for (int dg = 0; dg < ATD_TC_DG; dg++)
#pragma unroll
                for (int r = 0; r < 4; r++)
#pragma unroll
                    for (int e = 0; e < 4; e++) o[dg][r][e] *= corr;
        }
        uint32_t pa[4];
        atd_split_h2(p[0], p[1], pa[0], pa[1]);
        atd_split_h2(p[2], p[3], pa[2], pa[3]);
#pragma unroll
        for (int dg = 0; dg < ATD_TC_DG; dg++) {
            if (dg >= ndv) break;
            const uint32_t* va = reinterpret_cast<const uint32_t*>(&vr[0][dg]);
            const uint32_t* vc = reinterpret_cast<const uint32_t*>(&vr[1][dg]);
#pragma unroll
            for (int r = 0; r < 4; r++) rx_mma(o[dg][r], pa[0], pa[1], pa[2], pa[3], rx_movt(va[r]), rx_movt(vc[r]));
        }
    }
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    // the warps' results merge through shared memory: max, sum and output rows of each
    float *mw = scratch, *lw = scratch + 32, *ow = scratch + 64;
    if (g < G) {
        if (t == 0) mw[warp * 8 + g] = m, lw[warp * 8 + g] = l;
        float* orow = ow + (warp * G + g) * hd_v + 8 * t;
#pragma unroll
        for (int dg = 0; dg < ATD_TC_DG; dg++) {
            if (dg >= ndv) break;
#pragma unroll
            for (int r = 0; r < 4; r++)
                *reinterpret_cast<float2*>(orow + 32 * dg + 2 * r) =
                    make_float2(o[dg][r][0] + o[dg][r][2], o[dg][r][1] + o[dg][r][3]);
        }
    }
    atd_sync();
    // head h's weight of warp w's rows: exp(its max - the block's), 0 for a warp that saw no key
    auto weights = [&](int h, float* f) {
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < ATD_TC_WARPS; w++) M = fmaxf(M, mw[w * 8 + h]);
#pragma unroll
        for (int w = 0; w < ATD_TC_WARPS; w++) f[w] = mw[w * 8 + h] == -INFINITY ? 0.f : __expf(mw[w * 8 + h] - M);
        return M;
    };
    int n_c4 = hd_v / 4, n_items = G * n_c4;
#pragma unroll
    for (int i = 0; i < NI; i++) {
        int idx = tid + ATD_THREADS * i;
        if (idx >= n_items) break;
        int h = idx / n_c4, c4 = idx - h * n_c4;
        float f[ATD_TC_WARPS], a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
        weights(h, f);
#pragma unroll
        for (int w = 0; w < ATD_TC_WARPS; w++) {
            float4 v = reinterpret_cast<const float4*>(ow + (w * G + h) * hd_v)[c4];
            a0 += f[w] * v.x, a1 += f[w] * v.y, a2 += f[w] * v.z, a3 += f[w] * v.w;
        }
        acc[i][0] = a0, acc[i][1] = a1, acc[i][2] = a2, acc[i][3] = a3;
    }
    if (tid < G) {
        float f[ATD_TC_WARPS], L = 0.f, M = weights(tid, f);
#pragma unroll
        for (int w = 0; w < ATD_TC_WARPS; w++) L += f[w] * lw[w * 8 + tid];
        m_run[tid] = M, l_run[tid] = L;
    }
}

// The work of block (kvh, split, row) of a grid of max_split slices per KV head; smem: the
// dynamic shared memory (atd_smem_bytes). Every thread of the block calls it.
// n_hg > 1: the KV head's G query heads may be shared by n_hg blocks (this one is group hg), each
// taking G / n_hg heads over the same keys: when n_split * n_hg <= max_split (a short context,
// whose few slices would leave most SMs idle), else group 0 takes all G heads and the rest leave.
// wait(): called once; with `prefetch` only when the block has something to do (it returns before
// the wait otherwise).
// defer (<= ATD_DEFER_MAX): a row of 2 .. defer slices is left as its partials (atd_deferred), merged
// by the kernel that reads the output (the output projection, mvs.cuh MvsMerge) as it loads it: the
// merge's fence, counter and the last block's two L2 round trips were ~2.9 us of a 64-key launch
// (9.3 against 6.5 us at 16 keys, results/2026-12-05-h100-s31), all of it after the other blocks.
// MG, NI: the most query heads a block serves and (head, 4 dims) items a thread holds, which size
// its score and accumulator registers: reflex_attn_decode_g2 / _g4 (attn_decode.cu) instantiate it
// for the small groups most models have (125 registers at 16 / 8: four blocks an SM).
// TC (reflex_attn_decode_t*): a block whose slice holds tc_min keys or more walks them on tensor
// cores (atd_tc_keys), a shorter one through the tiles, whose first tile is staged before the wait.
template <class Wait = AtdPdlWait, int MG = ATD_MAXG, int NI = ATD_ITEMS, bool TC = false>
__device__ __forceinline__ void atd_body(const AtdArgs& a, uint8_t* smem, int kvh, int split, int max_split, int row,
                                         int hg = 0, int n_hg = 1, Wait wait = Wait(), int defer = 0,
                                         int tc_min = 0) {
    const float* q = a.q;
    half *k_cache = static_cast<half*>(a.k_cache), *v_cache = static_cast<half*>(a.v_cache);
    int* kv_pos = a.kv_pos;
    const int *q_pos = a.q_pos, *q_slot = a.q_slot, *seq_lo = a.seq_lo, *n_kv_ptr = a.n_kv_ptr;
    float *out = a.out, *part_o = a.part_o, *part_ml = a.part_ml;
    int* counters = a.counters;
    int n_head = a.n_head, n_head_kv = a.n_head_kv, hd = a.hd, hd_v = a.hd_v, n_rows = a.n_rows, window = a.window;
    float scale = a.scale, softcap = a.softcap;
    int min_keys = a.min_keys, prefetch = a.prefetch, window_slots = a.window_slots;
    AtdRope rope = a.rope;
    const int* kv_blocks = a.kv_blocks;
    __shared__ float m_run[ATD_MAXG], l_run[ATD_MAXG], corr[ATD_MAXG];
    __shared__ __align__(16) half kv16[512];  // rope: the new key and value as stored (f16)
    __shared__ int is_last;
    const int G_kv = n_head / n_head_kv;
    int G = G_kv;  // this block's query heads (G_kv / n_hg when the heads are shared; set by plan)
    // Row `row` is its own sequence's decode token (a batch of sequences, one token each): its
    // inputs, outputs, partials and counters are the row's own, its keys start at seq_lo[row].
    q += (long)row * n_head * hd;
    q_pos += row, q_slot += row;
    out += (long)row * n_head * hd_v;
    part_o += (long)row * n_head * max_split * hd_v;
    part_ml += (long)row * n_head * max_split * 2;
    counters += (long)row * n_head_kv * n_hg * ATD_COUNTERS;
    int first = seq_lo ? seq_lo[row] : 0;
    if (rope.k) rope.k += (long)row * n_head_kv * hd, rope.v += (long)row * n_head_kv * hd_v;
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int ks = 2 * hd + ATD_PAD, vs = 2 * hd_v + ATD_PAD;
    float* qs = reinterpret_cast<float*>(smem);  // G x hd, pre-scaled (room for G_kv)
    float* S = qs + G_kv * hd;                          // G x 32 scores, then probabilities
    uint8_t* kt0 = reinterpret_cast<uint8_t*>(S + G_kv * ATD_TILE);  // 2 K tiles, then 2 V tiles
    uint8_t* vt0 = kt0 + 2 * ATD_TILE * ks;
    // rope's scratch, used before the tile loop, in the second K tile's room (no copy lands there
    // before the loop): 4 KB of static shared memory less, so five blocks fit an SM (_g2, _g4)
    float* nwq = reinterpret_cast<float*>(kt0 + ATD_TILE * ks);  // the q / k norm weights (read before the wait)
    float* nwk = nwq + hd;
    float* knew = nwk + hd;                               // the new key, normalized and rotated
    float2* cs = reinterpret_cast<float2*>(knew + hd);   // cos / sin per pair (rope_dim / 2 <= hd / 2)
    half* kbase = k_cache + (long)kvh * n_rows * hd;
    half* vbase = v_cache + (long)kvh * n_rows * hd_v;
    bool fused = rope.k != nullptr;
    const AtdStager atd_stage{kbase, vbase, hd, hd_v, AtdLane(hd), AtdLane(hd_v), kv_blocks};

    int n_vis = 0, n_split = 1, j0 = 0, j1 = 0, lo = 0, chunk = 1;
    bool tc = false;  // this block's keys on tensor cores (TC and a long enough slice)
    auto plan = [&]() {  // the same numbers in every block of the KV head
        AtdPlan p = atd_plan(*n_kv_ptr, *q_slot, first, window, window_slots, min_keys, max_split, n_hg);
        n_vis = p.n_vis, lo = p.lo, n_split = p.n_split;
        chunk = (n_vis - lo + n_split - 1) / n_split;
        j0 = min(n_vis, lo + split * chunk);
        j1 = min(n_vis, j0 + chunk);
        G = G_kv / p.ng;
        tc = TC && j1 - j0 >= tc_min;
        return split >= n_split || hg >= p.ng;  // true: nothing for this block
    };
    // Keys staged before the wait: slots older than the newest (written by earlier launches). The
    // newest is staged after it, or, fused, made here from this step's raw key and value.
    int jn = -1;  // the newest key's slot (fused: the one this kernel writes)
    auto load_norms = [&]() {
        for (int d = tid; d < hd; d += ATD_THREADS) {
            if (rope.q_norm) nwq[d] = __ldg(rope.q_norm + d);
            if (rope.k_norm) nwk[d] = __ldg(rope.k_norm + d);
        }
    };
    if (prefetch) {
        if (plan()) return;
        if (fused) load_norms();
        jn = fused ? *q_slot : n_vis - 1;
        int t_end = min(j1, j0 + ATD_TILE);
        if (tc) {
            atd_tc_prefetch(kbase, vbase, hd, hd_v, kv_blocks, j0 + ATD_TC_KEYS * warp, j1, jn);
        } else {
            atd_stage(kt0, vt0, j0, min(t_end, jn), j0);
            if (jn + 1 < t_end) atd_stage(kt0, vt0, max(j0, jn + 1), t_end, j0);
        }
        if (fused) atd_angles(rope, *q_pos, cs);  // the position, like the slot, is the previous step's
    }
    wait();
    if (!prefetch) {
        if (plan()) return;
        if (fused) load_norms();
        jn = fused ? *q_slot : n_vis - 1;
        int t_end = min(j1, j0 + ATD_TILE);
        if (tc) {
            // nothing staged: each warp loads its own keys
        } else if (fused) {  // every key of the tile but the one this kernel makes
            atd_stage(kt0, vt0, j0, min(t_end, jn), j0);
            if (jn + 1 < t_end) atd_stage(kt0, vt0, max(j0, jn + 1), t_end, j0);
        } else {
            atd_stage(kt0, vt0, j0, t_end, j0);
        }
    } else if (!tc && !fused && jn >= j0 && jn < min(j1, j0 + ATD_TILE)) {
        atd_stage(kt0, vt0, jn, jn + 1, j0);  // the newest key
    }
    rx_cp_commit();

    int my_pos = *q_pos;
    const float* qh = q + ((long)kvh * G_kv + hg * G) * hd;
    if (!fused) {
        for (int i = tid; i < G * hd; i += ATD_THREADS) qs[i] = qh[i] * scale;
    } else {
        // q heads (and, in the new key's slice, the key) normalized and rotated as rope.cu does.
        // The block whose slice holds the new slot writes the new key and value (the last one
        // when the slot is not visible); trailing slices can be empty, so it need not be the last.
        bool mine = jn < n_vis ? split == (jn - lo) / chunk : split == n_split - 1;
        for (int i = tid; i < G * hd; i += ATD_THREADS) qs[i] = qh[i];
        if (mine) {  // the new key, and the new value as stored: loaded with q, one round trip
            for (int d = tid; d < hd; d += ATD_THREADS) knew[d] = rope.k[(long)kvh * hd + d];
            for (int d = tid; d < hd_v; d += ATD_THREADS) kv16[256 + d] = __float2half(rope.v[(long)kvh * hd_v + d]);
        }
        if (!prefetch) atd_angles(rope, my_pos, cs);
        atd_sync();
        for (int g = warp; g < G + (mine ? 1 : 0); g += ATD_THREADS / 32)
            atd_rope_head(g < G ? qs + g * hd : knew, hd, g < G ? (rope.q_norm ? nwq : nullptr) : (rope.k_norm ? nwk : nullptr),
                          rope, cs);
        atd_sync();
        for (int i = tid; i < G * hd; i += ATD_THREADS) qs[i] *= scale;
        if (mine) {  // with shared heads every group makes the key; group 0 stores it
            long at = rx_kv_row(kv_blocks, jn);
            for (int d = tid; d < hd; d += ATD_THREADS) {
                half h = __float2half(knew[d]);
                kv16[d] = h;
                if (hg == 0) kbase[at * hd + d] = h;
            }
            if (hg == 0)
                for (int d = tid; d < hd_v; d += ATD_THREADS) vbase[at * hd_v + d] = kv16[256 + d];
            if (kvh == 0 && hg == 0 && tid == 0) kv_pos[jn] = my_pos;  // for sliding windows
        }
    }
    int n_c4 = hd_v / 4, n_items = G * n_c4;
    float acc[NI][4];
    if (TC && tc) {
        if constexpr (TC) {  // (the tile kernels do not instantiate it)
            atd_sync();  // q scaled (and, fused, the new key in kv16 and the cache) for every warp
            atd_tc_keys<MG, NI>(qs, G, hd, hd_v, kbase, vbase, kv_blocks, j0, j1, jn, fused ? kv16 : nullptr, window,
                            my_pos, kv_pos, softcap, reinterpret_cast<float*>(kt0), m_run, l_run, acc);
        }
    } else {
        if (tid < G) m_run[tid] = -INFINITY, l_run[tid] = 0.f;
#pragma unroll
        for (int i = 0; i < NI; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
        int kk = tid >> 2, q4 = tid & 3;  // scoring: key kk of the tile, 16-byte chunks q4, q4 + 4, ...

        int buf = 0;
        for (int t0 = j0; t0 < j1; t0 += ATD_TILE, buf ^= 1) {
            int nk = min(ATD_TILE, j1 - t0);
            const uint8_t* kt = kt0 + buf * ATD_TILE * ks;
            const uint8_t* vt = vt0 + buf * ATD_TILE * vs;
            rx_cp_wait_all();
            atd_sync();  // this tile has landed; nobody still reads the other buffer
            if (fused && jn >= t0 && jn < t0 + nk) {  // the new key and value, made above
                uint8_t* kd = const_cast<uint8_t*>(kt) + (jn - t0) * ks;
                uint8_t* vd = const_cast<uint8_t*>(vt) + (jn - t0) * vs;
                for (int c = tid; c < hd / 8; c += ATD_THREADS)
                    reinterpret_cast<uint4*>(kd)[c] = reinterpret_cast<const uint4*>(kv16)[c];
                for (int c = tid; c < hd_v / 8; c += ATD_THREADS)
                    reinterpret_cast<uint4*>(vd)[c] = reinterpret_cast<const uint4*>(kv16 + 256)[c];
                atd_sync();
            }
            if (t0 + ATD_TILE < j1) {
                int u0 = t0 + ATD_TILE, u1 = min(j1, u0 + ATD_TILE);
                uint8_t* kn = kt0 + (buf ^ 1) * ATD_TILE * ks;
                uint8_t* vn = vt0 + (buf ^ 1) * ATD_TILE * vs;
                if (fused && jn >= u0 && jn < u1) {  // all but the new key: it is not in the cache yet
                    atd_stage(kn, vn, u0, jn, u0);
                    atd_stage(kn, vn, jn + 1, u1, u0);
                } else {
                    atd_stage(kn, vn, u0, u1, u0);
                }
                rx_cp_commit();
            }
            // scores of the tile's keys against every head
            float s[MG];
#pragma unroll
            for (int g = 0; g < MG; g++) s[g] = 0.f;
            if (kk < nk) {
                const uint8_t* krow = kt + kk * ks;
#pragma unroll 1
                for (int c = q4; c < hd / 8; c += 4) {
                    float kf[8];
                    atd_h8(*reinterpret_cast<const uint4*>(krow + 16 * c), kf);
#pragma unroll
                    for (int g = 0; g < MG; g++) {
                        if (g >= G) break;
                        float4 a = reinterpret_cast<const float4*>(qs + g * hd + 8 * c)[0];
                        float4 b = reinterpret_cast<const float4*>(qs + g * hd + 8 * c)[1];
                        s[g] += a.x * kf[0] + a.y * kf[1] + a.z * kf[2] + a.w * kf[3] + b.x * kf[4] + b.y * kf[5] +
                                b.z * kf[6] + b.w * kf[7];
                    }
                }
            }
#pragma unroll
            for (int g = 0; g < MG; g++) {
                if (g >= G) break;
                s[g] += __shfl_xor_sync(0xffffffffu, s[g], 1);
                s[g] += __shfl_xor_sync(0xffffffffu, s[g], 2);
            }
            if (q4 == 0) {
                // the new key's kv_pos may still be on its way (another block writes it): it is at my_pos
                bool newest = fused && t0 + kk == jn;
                bool ok = kk < nk && !(window > 0 && !newest && my_pos - kv_pos[t0 + kk] >= window);
#pragma unroll
                for (int g = 0; g < MG; g++) {
                    if (g >= G) break;
                    S[g * ATD_TILE + kk] = ok ? s[g] : -INFINITY;
                }
                if (softcap > 0.f && ok) {  // a loop of its own: tanhf unrolled per head is code off the usual path
#pragma unroll 1
                    for (int g = 0; g < G; g++) S[g * ATD_TILE + kk] = softcap * tanhf(S[g * ATD_TILE + kk] / softcap);
                }
            }
            atd_sync();
            // online softmax, one warp per head, one key per lane
            for (int g = warp; g < G; g += ATD_THREADS / 32) {
                float v = S[g * ATD_TILE + lane];
                float mo = m_run[g], mn = fmaxf(mo, warp_max(v));
                float c = 1.f, p = 0.f;
                if (mn != -INFINITY) {
                    c = mo == -INFINITY ? 0.f : __expf(mo - mn);
                    p = __expf(v - mn);
                }
                float ps = warp_sum(p);
                S[g * ATD_TILE + lane] = p;
                if (lane == 0) corr[g] = c, m_run[g] = mn, l_run[g] = l_run[g] * c + ps;
            }
            atd_sync();
            // acc = acc * corr + P V, 4 dimensions of one head per item
#pragma unroll
            for (int i = 0; i < NI; i++) {
                int idx = tid + ATD_THREADS * i;
                if (idx >= n_items) break;
                int g = idx / n_c4, c4 = idx - g * n_c4;
                float cg = corr[g];
                float a0 = acc[i][0] * cg, a1 = acc[i][1] * cg, a2 = acc[i][2] * cg, a3 = acc[i][3] * cg;
                const float* pg = S + g * ATD_TILE;
                const uint8_t* vp = vt + 8 * c4;
#pragma unroll 2
                for (int j = 0; j < nk; j++) {
                    float p = pg[j];
                    uint2 raw = *reinterpret_cast<const uint2*>(vp + j * vs);
                    float2 f0 = __half22float2(*reinterpret_cast<const half2*>(&raw.x));
                    float2 f1 = __half22float2(*reinterpret_cast<const half2*>(&raw.y));
                    a0 += p * f0.x, a1 += p * f0.y, a2 += p * f1.x, a3 += p * f1.y;
                }
                acc[i][0] = a0, acc[i][1] = a1, acc[i][2] = a2, acc[i][3] = a3;
            }
        }
    }
    atd_sync();  // m_run / l_run visible even when the slice was empty

    long h0 = (long)kvh * G_kv + hg * G;  // the block's first query head
    if (n_split == 1) {
#pragma unroll
        for (int i = 0; i < NI; i++) {
            int idx = tid + ATD_THREADS * i;
            if (idx >= n_items) break;
            int g = idx / n_c4, c4 = idx - g * n_c4;
            float l = l_run[g], inv = l > 0.f ? 1.f / l : 0.f;
            float4 o = make_float4(acc[i][0] * inv, acc[i][1] * inv, acc[i][2] * inv, acc[i][3] * inv);
            reinterpret_cast<float4*>(out + (h0 + g) * hd_v)[c4] = o;
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < NI; i++) {
        int idx = tid + ATD_THREADS * i;
        if (idx >= n_items) break;
        int g = idx / n_c4, c4 = idx - g * n_c4;
        reinterpret_cast<float4*>(part_o + ((h0 + g) * max_split + split) * hd_v)[c4] =
            make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
    }
    if (tid < G) {
        part_ml[((h0 + tid) * max_split + split) * 2] = m_run[tid];
        part_ml[((h0 + tid) * max_split + split) * 2 + 1] = l_run[tid];
    }
    if (atd_deferred(n_split, defer)) return;  // the output's reader merges them (no copy is in flight)
    // Merge in two levels (attention.cuh split_merge_done): runs of ATD_MERGE slices, then the
    // runs; the tiles' memory holds the weights (V tiles) and the partial sums (K tiles).
    rx_cp_wait_all();  // no copy may still land there
    const SplitMerge mg{part_o, part_ml, out, h0, G, hd_v, max_split};
    split_merge_done<ATD_THREADS, ATD_MERGE>(mg, counters + (kvh * n_hg + hg) * ATD_COUNTERS, split, n_split, is_last,
                                             reinterpret_cast<float*>(vt0), reinterpret_cast<float4*>(kt0), AtdSync{});
}
