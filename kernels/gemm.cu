// gemm.cu: Y[t, r] = sum_k X[t, k] W[r, k] on tensor cores for prompts (sm_80+), W read in its
// GGUF blocks in place, and the routed-expert (MoE) forms of it.
//
// Tile: BM tokens x BN weight rows, warps in a WM x WN grid, each warp MT x NT mma tiles of
// 16 tokens x 8 rows (mma.sync m16n8k16, f16 inputs, f32 accumulate). Two configurations:
//   L  128 x 128, 8 warps (2 x 4), 4 x 4 mma tiles per warp: long prompts, wide matrices
//   S   64 x 64,  4 warps (2 x 2), 2 x 4 mma tiles per warp: more blocks for small grids
// The host picks one per launch (gpu/ops/gemm.py cfg_for); scripts/bench_prefill.py times both.
//
// Pipeline over K. Weights: the raw GGUF bytes of a stage (KB weights of each of the tile's
// rows: one K-quant super-block, four 32-blocks, 64 f16 or 32 f32 values) go global -> shared
// with cp.async while the previous stage is being multiplied (double buffer). Rows are only
// 2-byte aligned in general (Q8_0 rows of 640 weights are 680 bytes), so each row's stage is
// copied as the 16-byte aligned chunks that cover it, keeping its address modulo 16: the
// decoders then read shared memory exactly as they read global memory. Chunk reads are clipped
// at the stage's end (cp.async src-size), so nothing outside the tensor is ever read provided
// the tensor starts 16-byte aligned (the host checks; GGUF aligns tensors to 32).
// Activations: f32 rows, 32 k at a time, copied with cp.async too, DA steps ahead into a ring of
// NA slots (no global load waits in registers), and rounded to f16 as fragments are formed.
// Fragments: each thread decodes 8 consecutive weights (dequant8) straight into its B
// registers for two k16 steps. That is legal because the mma sums over k: thread t (lane % 4)
// holds physical k 8t..8t+7 of a 32-wide step in place of the logical 2t.., 2t+8.., 16+2t..,
// 24+2t.., for A and B alike, so A is two 16-byte shared loads per row and B needs no shuffle.
//
// Kernels (per weight type, L and S):
//   reflex_gemm_<type>_<cfg>      up to 3 matrices of one type and K (q, k, v) into their own
//                                 outputs, optionally added to them (residual)
//   reflex_gemm_glu_<type>_<cfg>  gate and up in one pass: out = act(gate x) * (up x); the
//                                 tile's 8-row mma tiles alternate gate and up rows
// MoE: (token, expert) pairs grouped by expert (reflex_moe_group, with a list of tiles of the
// kernel's BM pairs), then one launch each, every expert at once. Two configurations, both one
// row of 4 warps so that a tile decodes each weight once: W (64 pairs x 128 rows; its warps skip
// the 16-pair parts past the expert's last pair) and N (32 x 128, name suffix _n). A 512-token
// prompt routes ~32 pairs to each of 128 experts, up to ~60: one W tile each, where 32-pair
// tiles take ~1.5 an expert, each decoding the expert's weights again:
//   reflex_moe_gemm_glu_<type>    act[i] = act(gate_e x[tok(i)]) * (up_e x[tok(i)]), pairs i in
//                                 expert order; x and act in f16 (x from reflex_gemm_to_half)
//   reflex_moe_gemm_down_<type>   x[t] += sum over t's k slots s of w[t,s] * down_e act[t,s]:
//                                 each tile writes w * y for its pairs to a scratch row, and the
//                                 block that completes a token's k slots for a column tile (an
//                                 atomic counter per token and column tile) adds them to x in
//                                 slot order. The sum is deterministic: the same order and
//                                 roundings whatever the schedule (counters are left at zero).
// Bound by tensor-core math for long prompts; weights are read once per BM tokens (per 64
// pairs of an expert).
// Dense products of a few tokens may split K across gridDim.z: a 64-token decode batch times a
// 1024-row matrix is 16 tiles, a 128-token prompt's output projection 32. A decode batch adds the
// partial sums atomically into its accumulated output; a prompt's are summed in slice order by the
// tile's last slice (deterministic: the same logits every run).
// The experts' activations travel in f16: the mma rounds them to f16 anyway (the same rounding
// of the same float, so the same bits as f32 rows rounded here), and f16 rows halve the copies
// and take the conversions out of the mainloop.
// Requirements (host): K % 32 == 0, W 16-byte aligned, x rows 16-byte aligned, x < 2^31 elements.
#include "common.cuh"
#include "mma.cuh"

// -- weight geometry at compile time --------------------------------------------------------------
// Type ids as in quant.cuh (3 = Q4_1, 7 = Q5_1: their decoders live in quant.cuh when present).
__host__ __device__ constexpr int rx_qk(int T) {
    return (T == RX_F32 || T == RX_F16 || T == RX_BF16) ? 1 : (T == RX_Q4_K || T == RX_Q5_K || T == RX_Q6_K) ? 256 : 32;
}
__host__ __device__ constexpr int rx_qbytes(int T) {
    return T == RX_F32 ? 4 : (T == RX_F16 || T == RX_BF16) ? 2 : T == RX_Q8_0 ? 34 : T == RX_Q4_0 ? 18
         : T == 3 ? 20 : T == RX_Q5_0 ? 22 : T == 7 ? 24 : T == RX_Q4_K ? 144 : T == RX_Q5_K ? 176
         : T == RX_Q6_K ? 210 : -1;
}

template <int T>
struct GemmRaw {
    static constexpr int QK = rx_qk(T);
    static constexpr int KB = T == RX_F32 ? 32 : QK == 1 ? 64 : QK == 256 ? 256 : 128;  // weights per stage
    static constexpr int SB = KB / QK * rx_qbytes(T);  // bytes of one row per stage
    static constexpr int SLOT = (SB + 15) / 16 * 16 + 16;  // shared bytes per row: covering chunks
    static constexpr int CPR = SLOT / 16;  // 16-byte chunks per row
    static_assert(rx_qbytes(T) > 0, "unknown weight type");
};

template <int WM_, int WN_, int MT_, int NT_, int MIN_BLOCKS_>
struct GemmCfg {
    static constexpr int WM = WM_, WN = WN_, MT = MT_, NT = NT_, MIN_BLOCKS = MIN_BLOCKS_;
    static constexpr int THREADS = 32 * WM * WN;
    static constexpr int BM = WM * MT * 16;  // tokens per tile
    static constexpr int BN = WN * NT * 8;   // weight rows per tile
    static_assert(NT % 2 == 0, "gate/up pairs need an even number of 8-row tiles per warp");
};
using GemmL = GemmCfg<2, 4, 4, 4, 2>;
using GemmS = GemmCfg<2, 2, 2, 4, 4>;

// Activations (XT: float, or __half where the producer wrote f16): 32-k steps of rows in a ring
// of NA slots, copied DA = NA - 1 steps ahead (at most one stage: the weights are copied one
// stage ahead and share the copy groups).
template <int T, class C, class XT>
struct GemmSmem {
    // 4 for 64 x 64 tiles, 3 where shared memory is tighter (128 tokens: 2 blocks an SM; 128-row
    // expert tiles: 3 or 4), never more than a stage's steps + 1
    static constexpr int NA_WANT = C::BM == 64 && C::BN == 64 ? 4 : 3;
    static constexpr int NA = NA_WANT < GemmRaw<T>::KB / 32 + 1 ? NA_WANT : GemmRaw<T>::KB / 32 + 1;
    static constexpr int DA = NA - 1;
    static constexpr int XB = sizeof(XT), ACH = 32 * XB / 16;  // 16-byte chunks of a row's 32-k step
    static constexpr int APT = C::BM * ACH / C::THREADS;     // chunks each thread copies a step
    static_assert(APT * C::THREADS == C::BM * ACH, "x tile must split evenly");
    static constexpr int A_BYTES = NA * C::BM * 32 * XB;
    static constexpr int B_BYTES = 2 * C::BN * GemmRaw<T>::SLOT;
    static constexpr int BYTES = B_BYTES + A_BYTES;
};

// -- decoding 8 weights into two k16 B fragments (4 registers of 2 halves) --------------------------
template <int T>
__device__ __forceinline__ void gemm_dequant8(const uint8_t* p, int g, uint32_t* h) {
    if constexpr (T == RX_F16) {
        uint4 v = *reinterpret_cast<const uint4*>(p + 16 * g);
        h[0] = v.x, h[1] = v.y, h[2] = v.z, h[3] = v.w;
    } else if constexpr (T == RX_Q8_0) {
        // int8 -> half exactly: 0x64XX is 1024 + XX, so (q ^ 0x80) placed under 0x64 minus 1152 is q
        const uint8_t* b = p + 34 * (g >> 2);
        __half2 d = __half2half2(*reinterpret_cast<const __half*>(b));
        const uint16_t* q = reinterpret_cast<const uint16_t*>(b + 2 + 8 * (g & 3));
        uint32_t w[2] = {((uint32_t)q[0] | ((uint32_t)q[1] << 16)) ^ 0x80808080u,
                         ((uint32_t)q[2] | ((uint32_t)q[3] << 16)) ^ 0x80808080u};
        const __half2 bias = __half2half2(__ushort_as_half((unsigned short)0x6480));  // 1152
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t u = __byte_perm(w[i >> 1], 0x64646464u, (i & 1) ? 0x4342 : 0x4140);
            __half2 v = __hmul2(__hsub2(*reinterpret_cast<__half2*>(&u), bias), d);
            h[i] = *reinterpret_cast<uint32_t*>(&v);
        }
    } else if constexpr (T == RX_Q5_0) {
        // 5-bit values 0..31: low nibbles | (qh bit << 4), then (1024 + v) - 1040 = v - 16, times d
        const uint8_t* b = p + 22 * (g >> 2);
        __half2 d = __half2half2(*reinterpret_cast<const __half*>(b));
        const uint16_t* b16 = reinterpret_cast<const uint16_t*>(b);
        uint32_t qh = (uint32_t)b16[1] | ((uint32_t)b16[2] << 16);
        int part = g & 3, shift = (part >> 1) * 4;
        const uint16_t* q = reinterpret_cast<const uint16_t*>(b + 6 + 8 * (part & 1));
        uint32_t hb = qh >> (8 * part);
        const __half2 bias = __half2half2(__ushort_as_half((unsigned short)0x6410));  // 1040
#pragma unroll
        for (int j = 0; j < 2; j++) {
            uint32_t lo = (((uint32_t)q[2 * j] | ((uint32_t)q[2 * j + 1] << 16)) >> shift) & 0x0F0F0F0Fu;
            // bits 4j..4j+3 of hb to bit 4 of bytes 0..3 (shifts by 4, 11, 18, 25 never overlap)
            uint32_t hi = (((hb >> (4 * j)) & 15u) * 0x02040810u) & 0x10101010u;
            uint32_t v = lo | hi;
#pragma unroll
            for (int k = 0; k < 2; k++) {
                uint32_t u = __byte_perm(v, 0x64646464u, k ? 0x4342 : 0x4140);
                __half2 r = __hmul2(__hsub2(*reinterpret_cast<__half2*>(&u), bias), d);
                h[2 * j + k] = *reinterpret_cast<uint32_t*>(&r);
            }
        }
    } else {
        float w[8];
        dequant8<T>(p, g, w);
#pragma unroll
        for (int i = 0; i < 4; i++) h[i] = rx_pack_h2(w[2 * i], w[2 * i + 1]);
    }
}

// -- the tile's operands --------------------------------------------------------------------------

template <class XT>
struct GemmA {  // x rows of the tile: row m is x[idx ? idx[m0 + m] : m0 + m], valid while m0 + m < m_end
    const XT* x;
    int stride;
    const int* idx;
    int m0, m_end;
};

struct GemmB {  // weight rows of the tile; glu: 8-row groups alternate w0 (gate) and w1 (up)
    const uint8_t* w0;
    const uint8_t* w1;
    long row_bytes;
    int n0, n_rows;
    bool glu;

    __device__ __forceinline__ const uint8_t* row(int v) const {
        int r = glu ? n0 + (v >> 4) * 8 + (v & 7) : n0 + v;
        if (r >= n_rows) return nullptr;
        const uint8_t* w = (glu && (v & 8)) ? w1 : w0;
        return w + (long)r * row_bytes;
    }
};

// A fragments of one 32-k step: k 8t..8t+7 of rows `row` (lo) and row + 8 (hi) as f16 pairs.
// f32 rows: chunks 2t and 2t + 1 (swizzled by row & 7), rounded to f16 here; f16 rows: chunk t.
__device__ __forceinline__ void gemm_a_frag(const float* a_s, int row, int t, uint32_t* lo, uint32_t* hi) {
    const int sw = row & 7;
    const float* r0 = a_s + row * 32;
    const float* r1 = r0 + 8 * 32;
    float4 l0 = *reinterpret_cast<const float4*>(r0 + ((2 * t) ^ sw) * 4);
    float4 l1 = *reinterpret_cast<const float4*>(r0 + ((2 * t + 1) ^ sw) * 4);
    float4 h0 = *reinterpret_cast<const float4*>(r1 + ((2 * t) ^ sw) * 4);
    float4 h1 = *reinterpret_cast<const float4*>(r1 + ((2 * t + 1) ^ sw) * 4);
    lo[0] = rx_pack_h2(l0.x, l0.y), lo[1] = rx_pack_h2(l0.z, l0.w);
    lo[2] = rx_pack_h2(l1.x, l1.y), lo[3] = rx_pack_h2(l1.z, l1.w);
    hi[0] = rx_pack_h2(h0.x, h0.y), hi[1] = rx_pack_h2(h0.z, h0.w);
    hi[2] = rx_pack_h2(h1.x, h1.y), hi[3] = rx_pack_h2(h1.z, h1.w);
}
__device__ __forceinline__ void gemm_a_frag(const __half* a_s, int row, int t, uint32_t* lo, uint32_t* hi) {
    uint4 l = *reinterpret_cast<const uint4*>(a_s + row * 32 + 8 * t);
    uint4 h = *reinterpret_cast<const uint4*>(a_s + (row + 8) * 32 + 8 * t);
    lo[0] = l.x, lo[1] = l.y, lo[2] = l.z, lo[3] = l.w;
    hi[0] = h.x, hi[1] = h.y, hi[2] = h.z, hi[3] = h.w;
}

// acc[mt][j] = the warp's 16 x 8 tile (mt, j) of X W^T over all of K.
// Copy groups: the prologue commits one per 32-k step 0..DA-1 (the first also holds stage 0's
// weights); step u commits one holding step u + DA's activations (and, at a stage's first step,
// the next stage's weights). Group i thus holds step i's activations, and waiting until at most
// DA - 1 groups are in flight at step u lands them, and this stage's weights (committed a whole
// stage, >= DA steps, earlier). One barrier per step: after it every warp is past step u - 1, so
// its activation slot, which step u + DA reuses, and at a stage's start the previous stage's
// weight buffer are free.
template <int T, class C, class XT>
__device__ __forceinline__ void gemm_mainloop(const GemmA<XT>& A, const GemmB& B, int K, unsigned char* smem,
                                              float (&acc)[C::MT][C::NT][4]) {
    using R = GemmRaw<T>;
    using S = GemmSmem<T, C, XT>;
    constexpr bool F16 = sizeof(XT) == 2;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / C::WN, wn = warp % C::WN, g = lane >> 2, t = lane & 3;
    unsigned char* Bs = smem;
    XT* As = reinterpret_cast<XT*>(smem + S::B_BYTES);

#pragma unroll
    for (int i = 0; i < C::MT; i++)
#pragma unroll
        for (int j = 0; j < C::NT; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[i][j][c] = 0.f;

    // x: each thread copies the same APT (row, 16-byte chunk) pieces of every 32-k step, as
    // element offsets from x (-1: a row past the tile's end, not copied: its garbage reaches only
    // its own output rows, which are never stored). f32: a row's chunk c lands at chunk c ^ (row &
    // 7), so the fragment loads below (rows g and g + 8 of a quarter warp) hit distinct banks; f16
    // rows are 64 bytes, two rows of a quarter warp one 128-byte line: no swizzle needed.
    int aoff[S::APT];
    uint32_t adst[S::APT];
    const uint32_t as0 = rx_saddr(As);
#pragma unroll
    for (int i = 0; i < S::APT; i++) {
        int idx = tid + C::THREADS * i, r = idx / S::ACH, c = idx % S::ACH, m = A.m0 + r;
        aoff[i] = m < A.m_end ? (A.idx ? A.idx[m] : m) * A.stride + c * (16 / S::XB) : -1;
        adst[i] = as0 + r * 32 * S::XB + 16 * (F16 ? c : c ^ (r & 7));
    }
    auto copy_a = [&](int u, int slot) {
#pragma unroll
        for (int i = 0; i < S::APT; i++)
            rx_cp16s_if(adst[i] + slot * (C::BM * 32 * S::XB), A.x + max(aoff[i], 0) + 32 * u, aoff[i] >= 0);
    };
    // weights: the rows this thread decodes (one per 8-row tile), by their address modulo 16
    uint32_t boff[C::NT];
#pragma unroll
    for (int j = 0; j < C::NT; j++) boff[j] = (uint32_t)(uintptr_t)B.row(wn * C::NT * 8 + j * 8 + g) & 15u;
    // Copies: two threads per row (even and odd 16-byte chunks: a pair reads whole 32-byte
    // sectors), THREADS / 2 rows a pass; each thread's row pointers found once, not per chunk.
    constexpr int RPP = C::THREADS / 2, PASSES = (C::BN + RPP - 1) / RPP, CPT = (R::CPR + 1) / 2;
    const uint8_t* brow[PASSES];
#pragma unroll
    for (int p = 0; p < PASSES; p++) brow[p] = (tid >> 1) + p * RPP < C::BN ? B.row((tid >> 1) + p * RPP) : nullptr;
    const uint32_t bs0 = rx_saddr(Bs) + (tid >> 1) * R::SLOT;  // this thread's row in pass 0
    auto copy_b = [&](int s, int buf) {
        const int sbytes = min(R::KB, K - s * R::KB) / R::QK * rx_qbytes(T);
#pragma unroll
        for (int p = 0; p < PASSES; p++) {
            if (!brow[p]) continue;
            const uint8_t* lo = brow[p] + (long)s * R::SB;
            const uint8_t* src = reinterpret_cast<const uint8_t*>((uintptr_t)lo & ~(uintptr_t)15);
            // the stage's bytes end `end` bytes from src: nf whole chunks, then rem bytes
            const int end = (int)((uintptr_t)lo & 15u) + sbytes, nf = end >> 4, rem = end & 15, par = tid & 1;
            const uint32_t dst = bs0 + (buf * C::BN + p * RPP) * R::SLOT;
#pragma unroll
            for (int i = 0; i < CPT; i++) {
                const int ch = 2 * i + par;
                rx_cp16s_if(dst + 16 * ch, src + 16 * ch, ch < nf);
            }
            if (rem && (nf & 1) == par) rx_cp16s_part(dst + 16 * nf, src + 16 * nf, rem);
        }
    };

    // a warp whose 16-row tiles all lie past the tile's last token (a half-full expert tile, the
    // prompt's last tile) skips its decoding and math; it still copies its share. A live warp
    // skips the math of its 16-row tiles past the end (mt_live of MT).
    const int mt_live = min(C::MT, (A.m_end - A.m0 - wm * C::MT * 16 + 15) / 16);
    const bool live = mt_live > 0;
    const int n_stage = (K + R::KB - 1) / R::KB, n_u = K / 32;
    copy_b(0, 0);
#pragma unroll
    for (int d = 0; d < S::DA; d++) {
        if (d < n_u) copy_a(d, d);
        rx_cp_commit();
    }
    int u = 0, slot = 0;  // slot = u % NA
    for (int s = 0; s < n_stage; s++) {
        const int nq = min(R::KB, K - s * R::KB) / 32;
        const unsigned char* bstage = Bs + (s & 1) * C::BN * R::SLOT;
        for (int q = 0; q < nq; q++, u++) {
            rx_cp_wait<S::DA - 1>();  // this thread's copies of step u (and stage s) landed
            __syncthreads();          // everyone's did; every warp is past step u - 1
            if (q == 0 && s + 1 < n_stage) copy_b(s + 1, (s + 1) & 1);
            if (u + S::DA < n_u) copy_a(u + S::DA, slot == 0 ? S::NA - 1 : slot - 1);
            rx_cp_commit();
            const XT* a_s = As + slot * C::BM * 32;
            slot = slot + 1 == S::NA ? 0 : slot + 1;
            if (!live) continue;
            uint32_t b[C::NT][4];
#pragma unroll
            for (int j = 0; j < C::NT; j++) {
                const unsigned char* rowp = bstage + (wn * C::NT * 8 + j * 8 + g) * R::SLOT;
                gemm_dequant8<T>(rowp + ((boff[j] + (uint32_t)(s * R::SB)) & 15u), q * 4 + t, b[j]);
            }
#pragma unroll
            for (int i = 0; i < C::MT; i++) {
                if (i >= mt_live) break;
                uint32_t lo[4], hi[4];
                gemm_a_frag(a_s, wm * C::MT * 16 + i * 16 + g, t, lo, hi);
#pragma unroll
                for (int j = 0; j < C::NT; j++) {
                    rx_mma(acc[i][j], lo[0], hi[0], lo[1], hi[1], b[j][0], b[j][1]);
                    rx_mma(acc[i][j], lo[2], hi[2], lo[3], hi[3], b[j][2], b[j][3]);
                }
            }
        }
    }
    rx_cp_wait<0>();  // no copy outlives the block (the last groups are empty, but keep it exact)
}

// Visit the warp's accumulators: f(m, n, v0, v1) for tile row m and tile columns n, n + 1.
template <class C, class F>
__device__ __forceinline__ void gemm_for_each(const float (&acc)[C::MT][C::NT][4], F f) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wm = warp / C::WN, wn = warp % C::WN, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < C::MT; i++)
#pragma unroll
        for (int j = 0; j < C::NT; j++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                f(wm * C::MT * 16 + i * 16 + g + 8 * h, wn * C::NT * 8 + j * 8 + 2 * t, acc[i][j][2 * h],
                  acc[i][j][2 * h + 1]);
}

// Gate/up pairs: f(m, c, act(gate) * up) for output column c (tile-relative, of BN / 2).
template <class C, class F>
__device__ __forceinline__ void gemm_for_each_glu(const float (&acc)[C::MT][C::NT][4], int act, F f) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wm = warp / C::WN, wn = warp % C::WN, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < C::MT; i++)
#pragma unroll
        for (int j = 0; j < C::NT; j += 2)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                int m = wm * C::MT * 16 + i * 16 + g + 8 * (c >> 1);
                int col = (wn * C::NT / 2 + j / 2) * 8 + 2 * t + (c & 1);
                f(m, col, rx_act(acc[i][j][c], act) * acc[i][j + 1][c]);
            }
}

struct GemmSegs {  // up to three matrices of one type and K; outputs of rows[s] floats per token
    const uint8_t* w[3];
    float* y[3];
    int rows[3];
    int tile_end[3];  // cumulative row tiles (BN) of segments 0..s
    // Split-K with a deterministic sum (gridDim.z > 1 and part set): each slice's partial tile goes
    // to part (slice z of segment s at part + n_tok * (z * sum(rows) + rows of segments before s)),
    // and the tile's last slice to finish (counters[tile], left at zero) adds them in slice order
    float* part;
    int* counters;
};

// The tile's last slice: y[tk, r] (+)= the slices' partial sums, added in slice order (the same
// sum whichever block finishes last). part_s: slice 0 of this segment; slice z is z * zstride on.
template <class C>
__device__ __forceinline__ void gemm_split_sum(const float* part_s, long zstride, float* y, int rows, int n_tok, int m0,
                                               int n0, int accumulate) {
    // float4 rows where every address stays 16-byte aligned (n0 is a multiple of BN)
    const bool vec = ((rows | zstride) & 3) == 0 && (((uintptr_t)part_s | (uintptr_t)y) & 15) == 0;
    constexpr int N4 = C::BN / 4;
    for (int e = threadIdx.x; e < C::BM * N4; e += C::THREADS) {
        int tk = m0 + e / N4, r = n0 + 4 * (e % N4);
        if (tk >= n_tok || r >= rows) continue;
        long at = (long)tk * rows + r;
        if (vec) {
            float4 s = __ldcg(reinterpret_cast<const float4*>(part_s + at));
            for (int z = 1; z < gridDim.z; z++) {
                float4 v = __ldcg(reinterpret_cast<const float4*>(part_s + z * zstride + at));
                s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
            }
            float4* d = reinterpret_cast<float4*>(y + at);
            if (accumulate) {
                float4 a = *d;
                s.x += a.x, s.y += a.y, s.z += a.z, s.w += a.w;
            }
            *d = s;
            continue;
        }
        for (int c = 0; c < 4 && r + c < rows; c++) {
            float s = __ldcg(part_s + at + c);
            for (int z = 1; z < gridDim.z; z++) s += __ldcg(part_s + z * zstride + at + c);
            y[at + c] = accumulate ? y[at + c] + s : s;
        }
    }
}

template <int T, class C>
__device__ __forceinline__ void gemm_dense(const GemmSegs& sg, long row_bytes, const float* x, int x_stride, int K,
                                           int n_tok, int accumulate) {
#if RX_SM80
    extern __shared__ __align__(16) unsigned char rx_smem[];
    // the block's segment, by selects (indexing a parameter array would copy it to local memory)
    int bx = blockIdx.x, s1 = bx >= sg.tile_end[0], s2 = bx >= sg.tile_end[1];
    int n0 = (bx - (s2 ? sg.tile_end[1] : s1 ? sg.tile_end[0] : 0)) * C::BN, m0 = blockIdx.y * C::BM;
    int rows = s2 ? sg.rows[2] : s1 ? sg.rows[1] : sg.rows[0];
    float* y = s2 ? sg.y[2] : s1 ? sg.y[1] : sg.y[0];
    const uint8_t* w = s2 ? sg.w[2] : s1 ? sg.w[1] : sg.w[0];
    // Split-K (gridDim.z > 1, for grids too small to fill the GPU: a few tokens times a narrow
    // matrix): this block takes its share of K's stages. Without part (a decode batch) it adds its
    // partial sums into y atomically, which the host guarantees holds what they add to
    // (accumulate); with part (prompts) the sum is deterministic (GemmSegs.part).
    const bool split = gridDim.z > 1, det = split && sg.part;
    int kc = K;
    if (split) {
        using R = GemmRaw<T>;
        int stages = (K + R::KB - 1) / R::KB, per = (stages + gridDim.z - 1) / gridDim.z;
        int s0 = blockIdx.z * per, s1 = min(stages, s0 + per);
        if (s0 >= s1 && !det) return;
        s0 = min(s0, s1);  // an empty slice (the host avoids them) still counts, with zeros
        x += (long)s0 * R::KB;
        w += (long)s0 * R::SB;
        kc = max(0, min(K, s1 * R::KB) - s0 * R::KB);
    }
    float acc[C::MT][C::NT][4];
    if (kc > 0) {
        gemm_mainloop<T, C>(GemmA<float>{x, x_stride, nullptr, m0, n_tok}, GemmB{w, nullptr, row_bytes, n0, rows, false},
                            kc, rx_smem, acc);
    } else {
#pragma unroll
        for (int i = 0; i < C::MT; i++)
#pragma unroll
            for (int j = 0; j < C::NT; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;
    }
    bool pairs = (rows & 1) == 0;  // float2 stores stay 8-byte aligned
    float* part_s = nullptr;
    long zstride = 0;
    if (det) {
        int before = s2 ? sg.rows[0] + sg.rows[1] : s1 ? sg.rows[0] : 0;
        zstride = (long)n_tok * (sg.rows[0] + sg.rows[1] + sg.rows[2]);
        part_s = sg.part + (long)n_tok * before;
        y = part_s + blockIdx.z * zstride;  // this slice's partial tile
    }
    gemm_for_each<C>(acc, [&](int m, int n, float v0, float v1) {
        int tk = m0 + m, r = n0 + n;
        if (tk >= n_tok || r >= rows) return;
        float* dst = y + (long)tk * rows + r;
        if (det) {  // the partial tile, plain stores
            dst[0] = v0;
            if (r + 1 < rows) dst[1] = v1;
            return;
        }
        if (split) {
            atomicAdd(dst, v0);
            if (r + 1 < rows) atomicAdd(dst + 1, v1);
            return;
        }
        if (pairs) {  // rows even: r + 1 < rows too
            float2 o = make_float2(v0, v1);
            if (accumulate) {
                float2 a = *reinterpret_cast<float2*>(dst);
                o.x += a.x, o.y += a.y;
            }
            *reinterpret_cast<float2*>(dst) = o;
            return;
        }
        dst[0] = accumulate ? dst[0] + v0 : v0;
        if (r + 1 < rows) dst[1] = accumulate ? dst[1] + v1 : v1;
    });
    if (!det) return;
    // the last of the tile's slices to get here sums them
    __shared__ int last;
    int* cnt = sg.counters + blockIdx.y * gridDim.x + blockIdx.x;
    if (!split_last(cnt, gridDim.z, last, BlockSync{})) return;
    if (threadIdx.x == 0) *cnt = 0;  // every slice has counted: ready for the next launch
    gemm_split_sum<C>(part_s, zstride, s2 ? sg.y[2] : s1 ? sg.y[1] : sg.y[0], rows, n_tok, m0, n0, accumulate);
#else
    __trap();  // never launched below sm_80 (gpu/ops/gemm.py ok); fail loudly if it were
#endif
}

template <int T, class C>
__device__ __forceinline__ void gemm_glu_dense(const uint8_t* Wg, const uint8_t* Wu, long row_bytes, const float* x,
                                               int x_stride, float* out, int n_ff, int K, int n_tok, int act) {
#if RX_SM80
    extern __shared__ __align__(16) unsigned char rx_smem[];
    int n0 = blockIdx.x * (C::BN / 2), m0 = blockIdx.y * C::BM;
    float acc[C::MT][C::NT][4];
    gemm_mainloop<T, C>(GemmA<float>{x, x_stride, nullptr, m0, n_tok}, GemmB{Wg, Wu, row_bytes, n0, n_ff, true}, K, rx_smem,
                        acc);
    gemm_for_each_glu<C>(acc, act, [&](int m, int c, float v) {
        if (m0 + m < n_tok && n0 + c < n_ff) out[(long)(m0 + m) * n_ff + n0 + c] = v;
    });
#else
    __trap();  // never launched below sm_80 (gpu/ops/gemm.py ok); fail loudly if it were
#endif
}

#define RX_GEMM(name, T)                                                                                           \
    extern "C" __global__ void __launch_bounds__(GemmL::THREADS, GemmL::MIN_BLOCKS) reflex_gemm_##name##_l(        \
        GemmSegs segs, long row_bytes, const float* x, int x_stride, int K, int n_tok, int accumulate) {          \
        rx_pdl_begin();                                                                                            \
        gemm_dense<T, GemmL>(segs, row_bytes, x, x_stride, K, n_tok, accumulate);                                  \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(GemmS::THREADS, GemmS::MIN_BLOCKS) reflex_gemm_##name##_s(        \
        GemmSegs segs, long row_bytes, const float* x, int x_stride, int K, int n_tok, int accumulate) {          \
        rx_pdl_begin();                                                                                            \
        gemm_dense<T, GemmS>(segs, row_bytes, x, x_stride, K, n_tok, accumulate);                                  \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(GemmL::THREADS, GemmL::MIN_BLOCKS) reflex_gemm_glu_##name##_l(    \
        const uint8_t* Wg, const uint8_t* Wu, long row_bytes, const float* x, int x_stride, float* out, int n_ff,  \
        int K, int n_tok, int act) {                                                                               \
        rx_pdl_begin();                                                                                            \
        gemm_glu_dense<T, GemmL>(Wg, Wu, row_bytes, x, x_stride, out, n_ff, K, n_tok, act);                        \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(GemmS::THREADS, GemmS::MIN_BLOCKS) reflex_gemm_glu_##name##_s(    \
        const uint8_t* Wg, const uint8_t* Wu, long row_bytes, const float* x, int x_stride, float* out, int n_ff,  \
        int K, int n_tok, int act) {                                                                               \
        rx_pdl_begin();                                                                                            \
        gemm_glu_dense<T, GemmS>(Wg, Wu, row_bytes, x, x_stride, out, n_ff, K, n_tok, act);                        \
    }

RX_FOR_EACH_TYPE(RX_GEMM)

// -- routed experts --------------------------------------------------------------------------------

// One warp row, so each weight is decoded once per tile: 64 pairs (W) or 32 (N) x 128 rows. The
// host gives reflex_moe_group the BM; W's warps skip the 16-pair parts past an expert's last pair.
// W runs 4 blocks an SM (128 registers, a few bytes spilled): the mainloop is latency-bound with
// 12 warps an SM (s23: 30B-A3B shape experts 25.5 -> 24.6 ms at 512 tokens, three blocks vs four).
using GemmMoeW = GemmCfg<1, 4, 4, 4, 4>;
using GemmMoeN = GemmCfg<1, 4, 2, 4, 4>;

template <int T, class C>
__device__ __forceinline__ void moe_gemm_glu(const uint8_t* Wg, const uint8_t* Wu, long row_bytes, long expert_bytes,
                                             const int* counts, const int* offsets, const int* tile_e,
                                             const int* tile_m0, const int* n_tiles, const int* pair_tok,
                                             const __half* x, int x_stride, __half* out, int n_ff, int K, int act) {
#if RX_SM80
    extern __shared__ __align__(16) unsigned char rx_smem[];
    int tile = blockIdx.y;
    if (tile >= *n_tiles) return;
    int e = tile_e[tile], off = offsets[e];
    int m0 = off + tile_m0[tile], m_end = off + counts[e], n0 = blockIdx.x * (C::BN / 2);
    float acc[C::MT][C::NT][4];
    gemm_mainloop<T, C>(GemmA<__half>{x, x_stride, pair_tok, m0, m_end},
                        GemmB{Wg + e * expert_bytes, Wu + e * expert_bytes, row_bytes, n0, n_ff, true}, K, rx_smem, acc);
    gemm_for_each_glu<C>(acc, act, [&](int m, int c, float v) {
        if (m0 + m < m_end && n0 + c < n_ff) out[(long)(m0 + m) * n_ff + n0 + c] = __float2half_rn(v);
    });
#else
    __trap();  // never launched below sm_80 (gpu/ops/gemm.py ok); fail loudly if it were
#endif
}

template <int T, class C>
__device__ __forceinline__ void moe_gemm_down(const uint8_t* Wd, long row_bytes, long expert_bytes, const int* counts,
                                              const int* offsets, const int* tile_e, const int* tile_m0,
                                              const int* n_tiles, const int* pair_id, const __half* act, int K,
                                              const float* wts, int k, float* ybuf, float* x, int n_embd,
                                              int* counters) {
#if RX_SM80
    extern __shared__ __align__(16) unsigned char rx_smem[];
    __shared__ int done_tok[C::BM];
    __shared__ int n_done;
    int tile = blockIdx.y;
    if (tile >= *n_tiles) return;
    int e = tile_e[tile], off = offsets[e];
    int m0 = off + tile_m0[tile], m_end = off + counts[e], n0 = blockIdx.x * C::BN;
    float acc[C::MT][C::NT][4];
    gemm_mainloop<T, C>(GemmA<__half>{act, K, nullptr, m0, m_end}, GemmB{Wd + e * expert_bytes, nullptr, row_bytes, n0, n_embd, false},
                        K, rx_smem, acc);
    gemm_for_each<C>(acc, [&](int m, int n, float v0, float v1) {
        if (m0 + m >= m_end || n0 + n >= n_embd) return;
        int p = pair_id[m0 + m];
        float w = wts[p];
        float* dst = ybuf + (long)p * n_embd + n0 + n;
        dst[0] = w * v0;
        if (n0 + n + 1 < n_embd) dst[1] = w * v1;
    });
    // Count this tile's pairs done for their tokens (this column tile); the block that brings a
    // token to k adds the token's k rows, in slot order, to x.
    if (threadIdx.x == 0) n_done = 0;
    __threadfence();  // our ybuf rows are visible device-wide before we count them
    __syncthreads();
    for (int m = threadIdx.x; m < C::BM && m0 + m < m_end; m += C::THREADS) {
        int tok = pair_id[m0 + m] / k;
        if (atomicAdd(&counters[(long)tok * gridDim.x + blockIdx.x], 1) == k - 1) done_tok[atomicAdd(&n_done, 1)] = tok;
    }
    __syncthreads();
    if (n_done == 0) return;
    __threadfence();
    int cols = min(C::BN, n_embd - n0);
    for (int i = threadIdx.x; i < n_done * cols; i += C::THREADS) {
        int tok = done_tok[i / cols], c = n0 + i % cols;
        const float* src = ybuf + (long)tok * k * n_embd + c;
        float s = 0.f;
        for (int sl = 0; sl < k; sl++) s += __ldcg(src + (long)sl * n_embd);
        x[(long)tok * n_embd + c] += s;
    }
    for (int i = threadIdx.x; i < n_done; i += C::THREADS) counters[(long)done_tok[i] * gridDim.x + blockIdx.x] = 0;
#else
    __trap();  // never launched below sm_80 (gpu/ops/gemm.py ok); fail loudly if it were
#endif
}

#define RX_MOE_GEMM_CFG(name, T, C, sfx)                                                                           \
    extern "C" __global__ void __launch_bounds__(C::THREADS, C::MIN_BLOCKS) reflex_moe_gemm_glu_##name##sfx(        \
        const uint8_t* Wg, const uint8_t* Wu, long row_bytes, long expert_bytes, const int* counts,                \
        const int* offsets, const int* tile_e, const int* tile_m0, const int* n_tiles, const int* pair_tok,       \
        const __half* x, int x_stride, __half* out, int n_ff, int K, int act) {                                    \
        rx_pdl_begin();                                                                                            \
        moe_gemm_glu<T, C>(Wg, Wu, row_bytes, expert_bytes, counts, offsets, tile_e, tile_m0, n_tiles, pair_tok,   \
                           x, x_stride, out, n_ff, K, act);                                                        \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(C::THREADS, C::MIN_BLOCKS) reflex_moe_gemm_down_##name##sfx(       \
        const uint8_t* Wd, long row_bytes, long expert_bytes, const int* counts, const int* offsets,               \
        const int* tile_e, const int* tile_m0, const int* n_tiles, const int* pair_id, const __half* act, int K,    \
        const float* wts, int k, float* ybuf, float* x, int n_embd, int* counters) {                               \
        rx_pdl_begin();                                                                                            \
        moe_gemm_down<T, C>(Wd, row_bytes, expert_bytes, counts, offsets, tile_e, tile_m0, n_tiles, pair_id, act,  \
                            K, wts, k, ybuf, x, n_embd, counters);                                                 \
    }
#define RX_MOE_GEMM(name, T) RX_MOE_GEMM_CFG(name, T, GemmMoeW, ) RX_MOE_GEMM_CFG(name, T, GemmMoeN, _n)

RX_FOR_EACH_TYPE(RX_MOE_GEMM)

// y = x rounded to f16, n % 8 == 0 (the experts' input rows for reflex_moe_gemm_glu)
extern "C" __global__ void reflex_gemm_to_half(const float* x, __half* y, long n) {
    rx_pdl_begin();
    for (long i = 8 * ((long)blockIdx.x * blockDim.x + threadIdx.x); i < n; i += 8L * gridDim.x * blockDim.x) {
        float4 a = *reinterpret_cast<const float4*>(x + i), b = *reinterpret_cast<const float4*>(x + i + 4);
        uint4 o = {rx_pack_h2(a.x, a.y), rx_pack_h2(a.z, a.w), rx_pack_h2(b.x, b.y), rx_pack_h2(b.z, b.w)};
        *reinterpret_cast<uint4*>(y + i) = o;
    }
}
