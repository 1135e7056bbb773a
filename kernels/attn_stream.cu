// attn_stream.cu: the decode attention of reflex_attn_decode (same parameters, grid and partials;
// attn_decode.cu describes them) with each warp streaming its own keys: the alternative for long
// contexts, chosen by the host (REFLEX_ATTN_STREAM; off until a GPU measures it, issue 27).
//
// Why: at 16,384 tokens the tiled kernel reads the cache at ~1.9 TB/s of the H200's 4.8. Its block
// walks its slice in 32-key tiles, one in flight while the four warps compute the other between six
// block barriers, so an SM has little in flight most of the time, and a third tile (or fewer
// blocks) did not help (results/2026-12-04-h200-s26: "bound per block"). Here a block's slice is
// dealt to its 4 warps 8 keys at a time (warp w takes groups w, w + 4, ...), and each warp keeps
// its own ring of STR_STAGES slots in shared memory, two groups in flight while it computes a
// third, with no block barrier between the first group and the last. A lane holds dimension pairs
// (2 l, 2 l + 1) + 64 p (one 4-byte shared load a pair): 8 keys' partial dots are summed by
// transposing them across the lanes (as attn_short.cuh), and an online softmax per query head runs over each group. The warps' (max, sum,
// output) merge in shared memory, and the slices merge as the tiled kernel's (split_merge_done).
// Before the wait (`prefetch`, as the tiled kernel): the plan, the norm weights, the rope angles and
// each warp's first two groups of keys older than the newest. The newest key (made here from the
// raw projections with rope.k, else read from the cache) reaches its slot from shared memory.
// Serves G <= STR_GM query heads per block and hd, hd_v <= 32 STR_MR (gpu/ops/attn_stream.py fits);
// a context of at most short_keys keys takes attn_short.cuh's path.
// Dynamic smem: attn_stream.py smem_bytes (the rings, the warps' merge, q, and at least the tiled
// layout attn_short.cuh uses).
#include "attn_short.cuh"

#define STR_GROUP 8   // keys a warp takes at a time
#define STR_STAGES 3  // ring slots per warp: two groups in flight while one is computed
#define STR_GM 4      // query heads a block serves at most (partials and outputs in registers)
#define STR_MR 4      // dimensions a lane holds per head: hd, hd_v <= 128

struct StrRing {  // one warp's ring: slot s holds 8 key rows (2 hd bytes) then 8 value rows (2 hd_v)
    uint8_t* base;
    int hd, hd_v, slot_bytes;
    __device__ __forceinline__ half* k(int s) const { return reinterpret_cast<half*>(base + s * slot_bytes); }
    __device__ __forceinline__ half* v(int s) const {
        return reinterpret_cast<half*>(base + s * slot_bytes + STR_GROUP * 2 * hd);
    }
};

// A lane's share of every group's copies, made once (the loop then divides nothing): 16-byte chunk
// c = lane + 32 i of the group's key rows (hd / 8 chunks a row) and of its value rows, as
// (row t << 16) | (offset in halves); t = 8: none.
#define STR_CP 4  // copies of each kind a lane makes per group: 8 rows x 16 chunks / 32 lanes at most
struct StrLane {
    int k[STR_CP], v[STR_CP];
    __device__ __forceinline__ StrLane(int hd, int hd_v, int lane) {
#pragma unroll
        for (int i = 0; i < STR_CP; i++) {
            int c = lane + 32 * i, nk = hd / 8, nv = hd_v / 8, tk = min(c / nk, STR_GROUP), tv = min(c / nv, STR_GROUP);
            k[i] = (tk << 16) | (8 * (c - tk * nk) & 0xffff);
            v[i] = (tv << 16) | (8 * (c - tv * nv) & 0xffff);
        }
    }
};

// Copy keys [r0, min(r0 + 8, j1)) but jn into slot s (every lane of the warp; 16-byte copies).
__device__ __forceinline__ void str_stage(const StrRing& ring, const StrLane& l, int s, const half* kbase,
                                          const half* vbase, int r0, int j1, int jn, const int* blocks) {
    half *kd = ring.k(s), *vd = ring.v(s);
#pragma unroll
    for (int i = 0; i < STR_CP; i++) {
        int t = l.k[i] >> 16, o = l.k[i] & 0xffff, j = r0 + t;
        if (t < STR_GROUP && j < j1 && j != jn) rx_cp16(kd + t * ring.hd + o, kbase + rx_kv_row(blocks, j) * ring.hd + o);
        t = l.v[i] >> 16, o = l.v[i] & 0xffff, j = r0 + t;
        if (t < STR_GROUP && j < j1 && j != jn)
            rx_cp16(vd + t * ring.hd_v + o, vbase + rx_kv_row(blocks, j) * ring.hd_v + o);
    }
}

// A row's dimension pairs this lane holds ((2 l, 2 l + 1) + 64 p, p < 2), one 4-byte load each; zeros
// past the row, or everywhere when !use (a stale row).
__device__ __forceinline__ void str_pairs(const half* row, int n, int lane, bool use, float* f) {
#pragma unroll
    for (int p = 0; p < STR_MR / 2; p++) {
        float2 v = make_float2(0.f, 0.f);
        if (use && 2 * lane + 64 * p < n) v = __half22float2(*reinterpret_cast<const half2*>(row + 2 * lane + 64 * p));
        f[2 * p] = v.x, f[2 * p + 1] = v.y;
    }
}

template <int N>
struct StrN {  // a head count as a type, for the generic lambda below
    static constexpr int v = N;
};

extern "C" __global__ void __launch_bounds__(ATD_THREADS, 3) reflex_attn_stream(
    const float* q, half* k_cache, half* v_cache, int* kv_pos, const int* q_pos, const int* q_slot,
    const int* seq_lo, const int* n_kv_ptr, float* out, float* part_o, float* part_ml, int* counters, int n_head,
    int n_head_kv, int hd, int hd_v, int n_rows, int window, float scale, float softcap, int min_keys, int prefetch,
    int window_slots, AtdRope rope, int short_keys, int n_hg, const int* kv_blocks) {
    rx_pdl_weights_first();  // early reads: cache rows of earlier launches, norm weights (attn_decode.cu's header)
    const AtdArgs a{q, k_cache, v_cache, kv_pos, q_pos, q_slot, seq_lo, n_kv_ptr, out, part_o, part_ml, counters, n_head,
                    n_head_kv, hd, hd_v, n_rows, window, scale, softcap, min_keys, prefetch, window_slots, rope,
                    kv_blocks, short_keys};
    const int kvh = blockIdx.x / n_hg, hg = blockIdx.x % n_hg, split = blockIdx.y, row = blockIdx.z;
    const int max_split = gridDim.y;
    if (short_keys && atd_short(a, kvh, split, row, hg, n_hg, max_split)) return;
    __shared__ float2 cs[128];          // rope: cos / sin per pair
    __shared__ float nwq[256], nwk[256];  // rope: the q / k norm weights
    __shared__ float knew[256];          // rope: the new key, normalized and rotated
    __shared__ __align__(16) half kv16[512];  // the new key and value as stored (f16)
    __shared__ int is_last;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int G_kv = n_head / n_head_kv, first = seq_lo ? seq_lo[row] : 0;
    const bool fused = rope.k != nullptr;
    q += (long)row * n_head * hd, q_pos += row, q_slot += row;
    out += (long)row * n_head * hd_v;
    part_o += (long)row * n_head * max_split * hd_v;
    part_ml += (long)row * n_head * max_split * 2;
    counters += (long)row * n_head_kv * n_hg * ATD_COUNTERS;
    if (fused) rope.k += (long)row * n_head_kv * hd, rope.v += (long)row * n_head_kv * hd_v;
    half* kbase = k_cache + (long)kvh * n_rows * hd;
    half* vbase = v_cache + (long)kvh * n_rows * hd_v;
    // shared memory: the rings, then q (G_kv x hd floats), then the warps' merge (4 x G x (hd_v + 2))
    const int slot_bytes = STR_GROUP * 2 * (hd + hd_v);
    const StrRing ring{rx_dyn_smem + warp * STR_STAGES * slot_bytes, hd, hd_v, slot_bytes};
    const StrLane cl(hd, hd_v, lane);
    float* qs = reinterpret_cast<float*>(rx_dyn_smem + ATD_THREADS / 32 * STR_STAGES * slot_bytes);
    float* mrg = qs + G_kv * hd;

    int n_vis, lo, n_split, G, j0, j1, jn, n_groups;
    auto plan = [&]() {  // the tiled kernel's slices and head groups
        AtdPlan p = atd_plan(*n_kv_ptr, *q_slot, first, window, window_slots, min_keys, max_split, n_hg);
        n_vis = p.n_vis, lo = p.lo, n_split = p.n_split, G = G_kv / p.ng;
        int chunk = (n_vis - lo + n_split - 1) / n_split;
        j0 = min(n_vis, lo + split * chunk), j1 = min(n_vis, j0 + chunk);
        jn = fused ? *q_slot : n_vis - 1;
        n_groups = (j1 - j0 + STR_GROUP - 1) / STR_GROUP;
        return split >= n_split || hg >= p.ng;
    };
    auto prologue = [&]() {  // norm weights, angles, each warp's first STR_STAGES - 1 groups
        for (int d = tid; d < hd; d += ATD_THREADS) {
            if (fused && rope.q_norm) nwq[d] = __ldg(rope.q_norm + d);
            if (fused && rope.k_norm) nwk[d] = __ldg(rope.k_norm + d);
        }
        if (fused) atd_angles(rope, *q_pos, cs);
        for (int k = 0; k < STR_STAGES - 1; k++) {
            int g = warp + 4 * k;
            if (g < n_groups) str_stage(ring, cl, k, kbase, vbase, j0 + STR_GROUP * g, j1, jn, kv_blocks);
            rx_cp_commit();
        }
    };
    if (prefetch) {
        if (plan()) return;
        prologue();
    }
    rx_pdl_begin();
    if (!prefetch) {
        if (plan()) return;
        prologue();
    }
    // q (and, in the newest key's slice, the new key and value), normalized and rotated as the
    // tiled kernel does (atd_rope_head); the block of the newest key's slice stores it
    // (the slot may be past the visible keys: then the last slice's block stores it, as the tiled kernel)
    const long h0 = (long)kvh * G_kv + hg * G;
    const bool mine = (jn >= j0 && jn < j1) || (fused && jn >= n_vis && split == n_split - 1);
    const int my_pos = *q_pos;
    for (int i = tid; i < G * hd; i += ATD_THREADS) qs[i] = q[h0 * hd + i];
    if (mine) {
        for (int d = tid; d < hd; d += ATD_THREADS)
            knew[d] = fused ? rope.k[(long)kvh * hd + d] : __half2float(kbase[rx_kv_row(kv_blocks, jn) * hd + d]);
        for (int d = tid; d < hd_v; d += ATD_THREADS)
            kv16[256 + d] = fused ? __float2half(rope.v[(long)kvh * hd_v + d]) : vbase[rx_kv_row(kv_blocks, jn) * hd_v + d];
    }
    atd_sync();
    if (fused) {
        for (int g = warp; g < G + (mine ? 1 : 0); g += ATD_THREADS / 32)
            atd_rope_head(g < G ? qs + g * hd : knew, hd, g < G ? (rope.q_norm ? nwq : nullptr) : (rope.k_norm ? nwk : nullptr),
                          rope, cs);
        atd_sync();
    }
    if (mine) {
        long at = rx_kv_row(kv_blocks, jn);
        for (int d = tid; d < hd; d += ATD_THREADS) {
            half h = __float2half(knew[d]);
            kv16[d] = h;
            if (fused && hg == 0) kbase[at * hd + d] = h;
        }
        if (fused && hg == 0)
            for (int d = tid; d < hd_v; d += ATD_THREADS) vbase[at * hd_v + d] = kv16[256 + d];
        if (fused && kvh == 0 && hg == 0 && tid == 0) kv_pos[jn] = my_pos;
        atd_sync();  // kv16 complete
    }

    // The loop and the warp's partials, for at most GM heads (registers sized to the block's G: a
    // 2-head block does not multiply zeros for 4)
    auto run = [&](auto gm) {
        constexpr int GM = decltype(gm)::v;
        // this warp's heads: q in registers, scaled; running max, sum and output per head
        // lane l holds dimension pairs (2 l, 2 l + 1) + 64 p: element r is dimension str_dim(r)
        auto str_dim = [&](int r) { return 2 * lane + 64 * (r >> 1) + (r & 1); };
        float qv[GM][STR_MR], acc[GM][STR_MR], m_run[GM], l_run[GM];
#pragma unroll
        for (int h = 0; h < GM; h++) {
            m_run[h] = -INFINITY, l_run[h] = 0.f;
#pragma unroll
            for (int r = 0; r < STR_MR; r++) {
                qv[h][r] = h < G && str_dim(r) < hd ? qs[h * hd + str_dim(r)] * scale : 0.f;
                acc[h][r] = 0.f;
            }
        }
        for (int k = 0;; k++) {
            int g = warp + 4 * k;
            if (g >= n_groups) break;
            rx_cp_wait_prior<STR_STAGES - 2>();  // this group's copies (each lane's own) have landed
            __syncwarp();                        // every lane's; and the slot refilled below was read
            {
                int gn = g + 4 * (STR_STAGES - 1);
                if (gn < n_groups)
                    str_stage(ring, cl, (k + STR_STAGES - 1) % STR_STAGES, kbase, vbase, j0 + STR_GROUP * gn, j1, jn, kv_blocks);
                rx_cp_commit();
            }
            const int s = k % STR_STAGES, r0 = j0 + STR_GROUP * g;
            half *ks = ring.k(s), *vs = ring.v(s);
            if (jn >= r0 && jn < min(r0 + STR_GROUP, j1)) {  // the newest key and value, from kv16
                int t = jn - r0;
                for (int d = lane; d < hd; d += 32) ks[t * hd + d] = kv16[d];
                for (int d = lane; d < hd_v; d += 32) vs[t * hd_v + d] = kv16[256 + d];
                __syncwarp();
            }
            // scores: part[h][t] this lane's share of key t against head h, summed across the lanes
            float sc[GM];
            {
                float part[GM][STR_GROUP];
#pragma unroll
                for (int t = 0; t < STR_GROUP; t++) {
                    float kf[STR_MR];
                    str_pairs(ks + t * hd, hd, lane, true, kf);
#pragma unroll
                    for (int h = 0; h < GM; h++) {
                        float x = 0.f;
#pragma unroll
                        for (int r = 0; r < STR_MR; r++) x += qv[h][r] * kf[r];
                        part[h][t] = x;
                    }
                }
                // as attn_short.cuh ats_scores8: lane l ends with key (l >> 2) & 7's sum
#pragma unroll
                for (int h = 0; h < GM; h++) {
                    if (h >= G) break;
#pragma unroll
                    for (int o = 16, w = 4; o >= 4; o >>= 1, w >>= 1) {
                        bool up = lane & o;
#pragma unroll
                        for (int t = 0; t < w; t++) {
                            float send = up ? part[h][t] : part[h][t + w], keep = up ? part[h][t + w] : part[h][t];
                            part[h][t] = keep + __shfl_xor_sync(0xffffffffu, send, o);
                        }
                    }
                    float v = part[h][0] + __shfl_xor_sync(0xffffffffu, part[h][0], 2);
                    sc[h] = v + __shfl_xor_sync(0xffffffffu, v, 1);
                }
            }
            // lane l's key: r0 + ((l >> 2) & 7); masked past the slice and outside a window
            const int j = r0 + ((lane >> 2) & 7);
            bool ok = j < j1;
            if (ok && window > 0 && j != jn) ok = my_pos - kv_pos[j] < window;  // the new key's kv_pos: it is at my_pos
            float vf[STR_GROUP][STR_MR];  // the group's values, read once for every head
#pragma unroll
            for (int t = 0; t < STR_GROUP; t++) {
                str_pairs(vs + t * hd_v, hd_v, lane, r0 + t < j1, vf[t]);
            }
#pragma unroll
            for (int h = 0; h < GM; h++) {
                if (h >= G) break;
                float x = sc[h];
                if (softcap > 0.f && ok) x = softcap * tanhf(x / softcap);
                x = ok ? x : -INFINITY;
                float mg = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));  // the group's max: 8 keys, 4 lanes each
                mg = fmaxf(mg, __shfl_xor_sync(0xffffffffu, mg, 8));
                mg = fmaxf(mg, __shfl_xor_sync(0xffffffffu, mg, 16));
                float mn = fmaxf(m_run[h], mg);
                float c = 1.f, p = 0.f;
                if (mn != -INFINITY) {
                    c = m_run[h] == -INFINITY ? 0.f : __expf(m_run[h] - mn);
                    p = ok ? __expf(x - mn) : 0.f;
                }
                float ps = p + __shfl_xor_sync(0xffffffffu, p, 4);
                ps += __shfl_xor_sync(0xffffffffu, ps, 8);
                ps += __shfl_xor_sync(0xffffffffu, ps, 16);
                m_run[h] = mn, l_run[h] = l_run[h] * c + ps;
#pragma unroll
                for (int r = 0; r < STR_MR; r++) acc[h][r] *= c;
#pragma unroll
                for (int t = 0; t < STR_GROUP; t++) {
                    float pt = __shfl_sync(0xffffffffu, p, 4 * t);  // lane 4 t holds key t's
#pragma unroll
                    for (int r = 0; r < STR_MR; r++) acc[h][r] += pt * vf[t][r];
                }
            }
        }
        rx_cp_wait_all();  // no copy may land in the rings after this (they become merge buffers)

        // the warps' partials of each head, merged: warp w's (m, l, o) at mrg[(w * G + h) * (hd_v + 2)]
#pragma unroll
        for (int h = 0; h < GM; h++) {
            if (h >= G) break;
            float* mw = mrg + (warp * G + h) * (hd_v + 2);
#pragma unroll
            for (int r = 0; r < STR_MR; r++)
                if (str_dim(r) < hd_v) mw[2 + str_dim(r)] = acc[h][r];
            if (lane == 0) mw[0] = m_run[h], mw[1] = l_run[h];
        }
    };
    if (G <= 1) run(StrN<1>{});
    else if (G <= 2) run(StrN<2>{});
    else run(StrN<STR_GM>{});
    atd_sync();
    for (int h = warp; h < G; h += ATD_THREADS / 32) {
        float M = -INFINITY, L = 0.f, e[ATD_THREADS / 32];
#pragma unroll
        for (int w = 0; w < ATD_THREADS / 32; w++) M = fmaxf(M, mrg[(w * G + h) * (hd_v + 2)]);
#pragma unroll
        for (int w = 0; w < ATD_THREADS / 32; w++) {
            const float* mw = mrg + (w * G + h) * (hd_v + 2);
            e[w] = mw[0] == -INFINITY ? 0.f : __expf(mw[0] - M);
            L += mw[1] * e[w];
        }
        for (int d = lane; d < hd_v; d += 32) {
            float o = 0.f;
#pragma unroll
            for (int w = 0; w < ATD_THREADS / 32; w++) o += mrg[(w * G + h) * (hd_v + 2) + 2 + d] * e[w];
            if (n_split == 1) out[(h0 + h) * hd_v + d] = L > 0.f ? o / L : 0.f;
            else part_o[((h0 + h) * max_split + split) * hd_v + d] = o;
        }
        if (n_split > 1 && lane == 0) {
            part_ml[((h0 + h) * max_split + split) * 2] = M;
            part_ml[((h0 + h) * max_split + split) * 2 + 1] = L;
        }
    }
    if (n_split == 1) return;
    atd_sync();  // the merge buffers below are the rings
    const SplitMerge mg{part_o, part_ml, out, h0, G, hd_v, max_split};
    split_merge_done<ATD_THREADS, ATD_MERGE>(mg, counters + (kvh * n_hg + hg) * ATD_COUNTERS, split, n_split, is_last,
                                             reinterpret_cast<float*>(rx_dyn_smem),
                                             reinterpret_cast<float4*>(rx_dyn_smem + 4 * 32 * STR_GM), AtdSync{});
}
