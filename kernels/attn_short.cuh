// attn_short.cuh: reflex_attn_decode's path for a short context (AtdArgs.short_keys): at most 64
// visible keys, one block per KV head (and head group), one warp per query head, no block barrier
// after the wait.
//
// Why: at a 5-token context the tiled path (attn_decode.cuh atd_body) spends ~5 us a layer after its
// wait in phases of a few warps between block barriers (q / k loads, norm and rope, the new key into
// the tile, scores, softmax, P V) for a few KB of keys (results/2026-12-04-h200-s24). Here the keys
// older than the newest land in shared memory before the wait (written two or more launches back,
// like the tiled path's first tile), with the norm weights in registers and the rope angles in shared
// memory; after it each warp works alone: lane l holds dimensions l, l + 32, ... of its head, so the
// RMSNorm is one warp sum and a NeoX pair (i, i + rope_dim / 2) sits in one lane (rope_dim a multiple
// of 64; a pairwise pair in lanes l and l ^ 1: one shuffle). The new key and value stay in registers
// (each warp makes them from the raw projections; the first warp of head group 0 stores them), 8 keys'
// partial dot products are summed by transposing them across the lanes (9 shuffles, 1 more to hand
// each lane its key's score), and the softmax over <= 64 keys needs no running maximum.
// Inlined into the kernel before the tiled body: as a function of its own (__noinline__) the kernel
// kept its AtdArgs on the stack and spilled more. The tiled path went from 125 registers and no spill
// to 128 and 8 bytes spilled outside its tile loop (sm_90; sm_75 spills 24 bytes, inside the loop).
#pragma once

#include "attn_decode.cuh"

#define ATS_KEYS 64  // keys at most: what atd_body's two K / V tiles hold
#define ATS_MAXR 8   // dimensions a lane holds: hd / 32 up to 256

// What the path reads, the pointers already at the block's row, KV head and first query head.
struct AtsIn {
    const float* q;          // the block's first query head: raw (fused) or rotated
    const float *k, *v;      // fused: the KV head's raw key and value (NULL: the cache has them)
    half *kbase, *vbase;     // the KV head's cache rows
    const int* kv_blocks;    // the paged cache's table (rx_kv_row)
    int* kv_pos;             // positions of the slots (logical)
    float* out;              // the block's first output head
    const float2* cs;        // shared memory: cos / sin of each rope pair (fused)
    const uint8_t *kt, *vt;  // shared memory: key / value row j at (j - lo) * ks / vs
    int ks, vs;
    int lo, n_vis, jn, pos, G, hd, hd_v, window;
    float scale, softcap;
    bool store;              // fused and head group 0: this block stores the new key and value
    bool store_pos;          // and kv_pos[jn] (KV head 0)
    AtdRope rope;
};

// What a lane holds for every head it serves, read before the wait: the norm weights of its
// dimensions.
struct AtsLane {
    float nq[ATS_MAXR], nk[ATS_MAXR];
};

// Whether the path serves a launch (the same answer in every block of it): n visible keys.
__device__ __forceinline__ bool ats_fits(int short_keys, int n, const AtdRope& r) {
    return short_keys > 0 && n >= 1 && n <= min(short_keys, ATS_KEYS) && (!r.k || r.mode == 1 || r.rope_dim % 64 == 0);
}

__device__ __forceinline__ void ats_lane(AtsLane& w, const AtdRope& rp, int R, int lane) {
#pragma unroll
    for (int r = 0; r < ATS_MAXR; r++) {
        w.nq[r] = r < R && rp.q_norm ? __ldg(rp.q_norm + lane + 32 * r) : 1.f;
        w.nk[r] = r < R && rp.k_norm ? __ldg(rp.k_norm + lane + 32 * r) : 1.f;
    }
}

// NeoX rotation of H rows against the H rows after them: pair (i, i + 32 H) is x[r], x[r + H];
// cs: every pair's cos / sin (shared memory).
template <int H>
__device__ __forceinline__ void ats_neox(float* x, const float2* cs, int lane) {
#pragma unroll
    for (int r = 0; r < H; r++) {
        float2 c = cs[lane + 32 * r];
        float a = x[r], b = x[r + H];
        x[r] = a * c.x - b * c.y;
        x[r + H] = a * c.y + b * c.x;
    }
}

// One head in a warp's registers (x[r]: dimension lane + 32 r of R rows): RMSNorm with nw (when
// the model has it), then rotated as rope.cu does.
__device__ __forceinline__ void ats_norm_rope(float* x, int R, bool norm, const float* nw, const AtdRope& rp,
                                              const float2* cs, int lane) {
    if (norm) {
        float ss = 0.f;
#pragma unroll
        for (int r = 0; r < ATS_MAXR; r++) ss += x[r] * x[r];  // rows from R on are 0
        float sc = rsqrtf(warp_sum(ss) / (32 * R) + rp.eps);
#pragma unroll
        for (int r = 0; r < ATS_MAXR; r++) x[r] *= sc * nw[r];
    }
    if (rp.mode == 1) {  // pairs (2i, 2i + 1): the even lane holds the first
#pragma unroll
        for (int r = 0; r < ATS_MAXR; r++) {
            int d = lane + 32 * r;
            float o = __shfl_xor_sync(0xffffffffu, x[r], 1);
            if (d < rp.rope_dim) {
                float2 c = cs[d >> 1];
                x[r] = lane & 1 ? o * c.y + x[r] * c.x : x[r] * c.x - o * c.y;
            }
        }
        return;
    }
    switch (rp.rope_dim >> 6) {  // rows of the first half (ats_fits: rope_dim a multiple of 64)
        case 1: ats_neox<1>(x, cs, lane); break;
        case 2: ats_neox<2>(x, cs, lane); break;
        case 3: ats_neox<3>(x, cs, lane); break;
        case 4: ats_neox<4>(x, cs, lane); break;
    }
}

// Scores of rows c0 .. c0 + 7 against q (this lane's dimensions in qv), each summed over the
// lanes: lane l returns row c0 + ((l >> 2) & 7)'s. Row rn is the new key, in registers (kn); rows
// from n on score 0. Eight rows at a time: more would have the compiler hoist every row's loads
// into registers (254 a thread at 32 rows).
__device__ __forceinline__ float ats_scores8(const AtsIn& s, const float* qv, const float* kn, int R, int c0, int n,
                                             int rn, int lane) {
    float p[8];
#pragma unroll
    for (int t = 0; t < 8; t++) {
        int row = c0 + t;  // the same in every lane: no divergence
        float a = 0.f;
        if (row == rn) {
#pragma unroll
            for (int r = 0; r < ATS_MAXR; r++) a += qv[r] * kn[r];  // rows from R on are 0
        } else if (row < n) {
            const half* kr = reinterpret_cast<const half*>(s.kt + row * s.ks) + lane;
#pragma unroll
            for (int r = 0; r < ATS_MAXR; r++)
                if (r < R) a += qv[r] * __half2float(kr[32 * r]);
        }
        p[t] = a;
    }
    // Each step sums lane pairs across bit o and halves the values a lane keeps (the lanes with
    // bit o set keep the upper half): after bits 4, 3, 2 a lane holds row (l >> 2) & 7 summed over
    // 8 lanes, and bits 1, 0 sum the rest.
#pragma unroll
    for (int o = 16, h = 4; o >= 4; o >>= 1, h >>= 1) {
        bool up = lane & o;
#pragma unroll
        for (int t = 0; t < h; t++) {
            float send = up ? p[t] : p[t + h], keep = up ? p[t + h] : p[t];
            p[t] = keep + __shfl_xor_sync(0xffffffffu, send, o);
        }
    }
    float v = p[0] + __shfl_xor_sync(0xffffffffu, p[0], 2);
    return v + __shfl_xor_sync(0xffffffffu, v, 1);
}

// acc += sum over rows c0 .. c0 + 7 (< n) of p_row V[row]; lane t holds p of row (c0 & 31) + t.
__device__ __forceinline__ void ats_pv8(const AtsIn& s, float* acc, const float* vn, float p, int RV, int c0, int n,
                                        int rn, int lane) {
#pragma unroll
    for (int t = 0; t < 8; t++) {
        int row = c0 + t;
        if (row >= n) break;
        float pt = __shfl_sync(0xffffffffu, p, (c0 & 31) + t);
        if (row == rn) {
#pragma unroll
            for (int r = 0; r < ATS_MAXR; r++) acc[r] += pt * vn[r];
        } else {
            const half* vr = reinterpret_cast<const half*>(s.vt + row * s.vs) + lane;
#pragma unroll
            for (int r = 0; r < ATS_MAXR; r++)
                if (r < RV) acc[r] += pt * __half2float(vr[32 * r]);
        }
    }
}

// Query head g of the block, by one warp.
__device__ __forceinline__ void ats_head(const AtsIn& s, const AtsLane& w, int g) {
    int lane = threadIdx.x & 31, R = s.hd >> 5, RV = s.hd_v >> 5;
    int n = s.n_vis - s.lo, rn = s.jn - s.lo;  // keys; the new key's row (visible when < n)
    bool fused = s.k != nullptr;
    long at = rx_kv_row(s.kv_blocks, s.jn);
    float qv[ATS_MAXR], kn[ATS_MAXR], vn[ATS_MAXR];  // rows from R (RV) on stay 0
    // every global read at once: q, the new key and value, the positions a window tests
    const float* qh = s.q + (long)g * s.hd + lane;
#pragma unroll
    for (int r = 0; r < ATS_MAXR; r++) {
        qv[r] = r < R ? qh[32 * r] : 0.f;
        kn[r] = vn[r] = 0.f;
    }
    if (fused) {
#pragma unroll
        for (int r = 0; r < ATS_MAXR; r++) {
            if (r < R) kn[r] = s.k[lane + 32 * r];
            if (r < RV) vn[r] = s.v[lane + 32 * r];
        }
    } else if (rn >= 0 && rn < n) {  // the predecessor stored it (a separate rope launch)
#pragma unroll
        for (int r = 0; r < ATS_MAXR; r++) {
            if (r < R) kn[r] = __half2float(s.kbase[at * s.hd + lane + 32 * r]);
            if (r < RV) vn[r] = __half2float(s.vbase[at * s.hd_v + lane + 32 * r]);
        }
    }
    int kp0 = 0, kp1 = 0;  // not the new key's (fused: a block of this launch writes it)
    if (s.window > 0) {
        if (lane < n && !(fused && lane == rn)) kp0 = s.kv_pos[s.lo + lane];
        if (32 + lane < n && !(fused && 32 + lane == rn)) kp1 = s.kv_pos[s.lo + 32 + lane];
    }
    if (fused) {
        ats_norm_rope(qv, R, s.rope.q_norm, w.nq, s.rope, s.cs, lane);
        ats_norm_rope(kn, R, s.rope.k_norm, w.nk, s.rope, s.cs, lane);
        bool st = s.store && g == 0;
#pragma unroll
        for (int r = 0; r < ATS_MAXR; r++) {  // scored as stored: f16
            if (r < R) {
                half h = __float2half(kn[r]);
                kn[r] = __half2float(h);
                if (st) s.kbase[at * s.hd + lane + 32 * r] = h;
            }
            if (r < RV) {
                half h = __float2half(vn[r]);
                vn[r] = __half2float(h);
                if (st) s.vbase[at * s.hd_v + lane + 32 * r] = h;
            }
        }
        if (st && s.store_pos && lane == 0) s.kv_pos[s.jn] = s.pos;  // for sliding windows
    }
#pragma unroll
    for (int r = 0; r < ATS_MAXR; r++) qv[r] *= s.scale;

    // lane t: the scores of rows t and 32 + t
    float sc[2] = {0.f, 0.f}, p[2] = {0.f, 0.f};
#pragma unroll 1
    for (int c0 = 0; c0 < n; c0 += 8) {
        float v = __shfl_sync(0xffffffffu, ats_scores8(s, qv, kn, R, c0, n, rn, lane), 4 * (lane & 7));
        if ((lane >> 3) == ((c0 >> 3) & 3)) {
            if (c0 < 32) sc[0] = v;  // constant indices: sc stays in registers
            else sc[1] = v;
        }
    }
    bool ok[2];
#pragma unroll
    for (int c = 0; c < 2; c++) {
        int row = 32 * c + lane;
        // the new key's kv_pos may not be written yet (this kernel writes it): it is at pos
        ok[c] = row < n && !(s.window > 0 && !(fused && row == rn) && s.pos - (c ? kp1 : kp0) >= s.window);
        if (s.softcap > 0.f && ok[c]) sc[c] = s.softcap * tanhf(sc[c] / s.softcap);
        sc[c] = ok[c] ? sc[c] : -INFINITY;
    }
    float m = warp_max(fmaxf(sc[0], sc[1]));
    if (m != -INFINITY) {
        p[0] = ok[0] ? __expf(sc[0] - m) : 0.f;
        p[1] = ok[1] ? __expf(sc[1] - m) : 0.f;
    }
    float l = warp_sum(p[0] + p[1]), inv = l > 0.f ? 1.f / l : 0.f;
    float acc[ATS_MAXR];
#pragma unroll
    for (int r = 0; r < ATS_MAXR; r++) acc[r] = 0.f;
#pragma unroll 1
    for (int c0 = 0; c0 < n; c0 += 8) ats_pv8(s, acc, vn, c0 < 32 ? p[0] : p[1], RV, c0, n, rn, lane);
    float* o = s.out + (long)g * s.hd_v + lane;
#pragma unroll
    for (int r = 0; r < ATS_MAXR; r++)
        if (r < RV) o[32 * r] = acc[r] * inv;
}

// Block (kvh, split, row, hg) of reflex_attn_decode when the short path serves the launch: true
// (the block is done), else false before touching anything (atd_body then runs). With `prefetch`
// it reads what the tiled path reads before the wait (the plan's slot / count / position, the
// older keys, the norm weights) and then waits; without, it waits first.
__device__ __forceinline__ bool atd_short(const AtdArgs& a, int kvh, int split, int row, int hg, int n_hg, int max_split) {
    if (!a.prefetch) rx_pdl_begin();
    int first = a.seq_lo ? a.seq_lo[row] : 0;
    const int* q_slot = a.q_slot + row;
    AtdPlan p = atd_plan(*a.n_kv_ptr, *q_slot, first, a.window, a.window_slots, a.min_keys, max_split, n_hg);
    if (!ats_fits(a.short_keys, p.n_vis - p.lo, a.rope)) return false;
    // split 0 of each of the n_hg head groups takes every key (the tiled plan's ng shrinks with the
    // grid's slices, which do not matter here: a big batch's rows may have one)
    if (split) return true;
    const int G_kv = a.n_head / a.n_head_kv, G = G_kv / n_hg, hd = a.hd, hd_v = a.hd_v;
    const int ks = 2 * hd + ATD_PAD, vs = 2 * hd_v + ATD_PAD;
    const bool fused = a.rope.k != nullptr;
    half* kbase = static_cast<half*>(a.k_cache) + (long)kvh * a.n_rows * hd;
    half* vbase = static_cast<half*>(a.v_cache) + (long)kvh * a.n_rows * hd_v;
    // atd_body's q (here: the rope's cos / sin, 4 rope_dim <= 4 hd bytes), then its K and V tiles
    float2* cs = reinterpret_cast<float2*>(rx_dyn_smem);
    uint8_t* kt = rx_dyn_smem + 4 * G_kv * (hd + ATD_TILE);
    uint8_t* vt = kt + 2 * ATD_TILE * ks;
    const AtdStager stage{kbase, vbase, hd, hd_v, AtdLane(hd), AtdLane(hd_v), a.kv_blocks};
    int jn = fused ? *q_slot : p.n_vis - 1;  // the newest key: from registers, not staged
    stage(kt, vt, p.lo, min(p.n_vis, jn), p.lo);
    if (jn + 1 < p.n_vis) stage(kt, vt, max(p.lo, jn + 1), p.n_vis, p.lo);
    rx_cp_commit();
    int pos = a.q_pos[row];
    AtsLane w;
    if (fused) {
        ats_lane(w, a.rope, hd >> 5, threadIdx.x & 31);
        atd_angles(a.rope, pos, cs);
    }
    rx_cp_wait_all();
    atd_sync();
    if (a.prefetch) rx_pdl_begin();
    const long h0 = (long)kvh * G_kv + hg * G, kvo = ((long)row * a.n_head_kv + kvh);
    const AtsIn s{a.q + ((long)row * a.n_head + h0) * hd, fused ? a.rope.k + kvo * hd : nullptr,
                  fused ? a.rope.v + kvo * hd_v : nullptr, kbase, vbase, a.kv_blocks, a.kv_pos,
                  a.out + ((long)row * a.n_head + h0) * hd_v, cs, kt, vt, ks, vs, p.lo, p.n_vis, jn, pos, G, hd, hd_v,
                  a.window, a.scale, a.softcap, fused && hg == 0, kvh == 0 && hg == 0, a.rope};
#pragma unroll 1
    for (int g = threadIdx.x >> 5; g < G; g += ATD_THREADS / 32) ats_head(s, w, g);
    return true;
}
