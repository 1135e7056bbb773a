// flash_attn.cu: softmax(q k^T * scale) v for a batch of query tokens on tensor cores (sm_80+),
// over the f16 KV cache ([n_head_kv][n_rows][head_dim], rows through kv_blocks); prompts and system1 trees. Decode (one
// token) stays on attention.cu's reflex_attn.
//
// Visibility is attention.cu's rule: a query at slot s sees cache slot j when j <= s, j < n_kv,
// (j < prefix_len or j >= seg_lo[t]), and (window <= 0 or pos[t] - kv_pos[j] < window).
// seg_lo without a prefix is a batch of several sequences' prompt chunks (gpu/batch.py packs them),
// each token's keys in its own range from seg_lo[t]: a block starts at its tokens' lowest seg_lo, and
// only the slots some token of the block sees are loaded (the others, a gap between two sequences'
// ranges, may hold anything, NaN included, and are zero-filled like the keys past the last visible).
//
// Grid (ceil(n_tok / BT), n_head_kv); 128 threads = 4 warps. A block takes the 64 query rows
// (token, head) of BT = 64 / G consecutive tokens and the G = n_head / n_head_kv query heads of
// one KV head (GQA: each K/V tile is read once for all of them); each warp owns 16 rows. Per
// tile of BKV keys: S = Q K^T (mma.sync m16n8k16, f16 in, f32 out), masked, an online softmax
// in registers (exp2, per-row max and sum), then O += P V with P rounded to f16. K and V tiles
// go global -> shared with cp.async, V(i) landing while S(i) is computed and K(i+1) while P V(i)
// is. Keys past the block's last visible slot are zero-filled (never NaN garbage times 0); a warp
// skips tiles wholly past its rows' slots; with a window, tiles wholly before every row's window
// are skipped (found from kv_pos, which need not be monotonic). Shared rows are padded by 16
// bytes so ldmatrix reads hit distinct banks.
// Bound by tensor-core math: 4 * n_tok * n_kv/2 * head_dim flops per head for a causal prompt.
// head_dim == head_dim_v in {64, 128, 256}; G <= 64 (gpu/ops/flash_attn.py ok falls back otherwise).
#include "common.cuh"
#include "mma.cuh"

#define FA_ROWS 64  // query rows per block, 16 per warp

template <int HD>
struct FaCfg {
    static constexpr int BKV = HD >= 256 ? 32 : 64;  // keys per tile (registers: O is HD / 2 floats per thread)
    static constexpr int LD = HD + 8;  // halves per shared row
    static constexpr int BYTES = (FA_ROWS + 2 * BKV) * LD * 2;
};

template <int HD>
__device__ __forceinline__ void flash_attn(const float* q, const half* k_cache, const half* v_cache, const int* kv_pos,
                                           const int* q_pos, const int* q_slot, const int* seg_lo, int prefix_len,
                                           const int* n_kv_ptr, float* out, int n_tok, int n_head, int n_head_kv,
                                           int n_rows, int window, float scale, float softcap,
                                           const int* kv_blocks) {
#if RX_SM80
    using C = FaCfg<HD>;
    constexpr int BKV = C::BKV, LD = C::LD, NB = BKV / 8, KD = HD / 16, ND = HD / 8;
    constexpr float LOG2E = 1.4426950408889634f;
    extern __shared__ __align__(16) unsigned char rx_smem[];
    half* Qs = reinterpret_cast<half*>(rx_smem);
    half* Ks = Qs + FA_ROWS * LD;
    half* Vs = Ks + BKV * LD;
    __shared__ int s_hi, s_minpos, s_lo, s_nseg;
    __shared__ int s_seg_lo[FA_ROWS], s_seg_hi[FA_ROWS];  // (segments) the slot intervals the block's tokens see
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int G = n_head / n_head_kv, BT = FA_ROWS / G, kvh = blockIdx.y, tok0 = blockIdx.x * BT;
    const int n_kv = *n_kv_ptr;

    // this thread's two rows: g and g + 8 of its warp's 16
    int r_tok[2], r_head[2], r_nvis[2], r_lo[2], r_pos[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int r = warp * 16 + g + 8 * h, tk = tok0 + r / G;
        bool ok = r < BT * G && tk < n_tok;
        r_tok[h] = ok ? tk : -1;
        r_head[h] = kvh * G + r % G;
        r_nvis[h] = ok ? min(n_kv, q_slot[tk] + 1) : 0;
        r_lo[h] = ok && seg_lo ? seg_lo[tk] : 0;
        r_pos[h] = ok ? q_pos[tk] : 0;
    }
    const bool segments = seg_lo != nullptr && prefix_len == 0;
    if (tid == 0) s_hi = 0, s_minpos = 0x7fffffff;
    __syncthreads();
    if (tid < BT && tok0 + tid < n_tok) {
        atomicMax(&s_hi, min(n_kv, q_slot[tok0 + tid] + 1));
        atomicMin(&s_minpos, q_pos[tok0 + tid]);
    }
    if (segments && tid == 0) {  // a sequence's tokens are consecutive: one interval per run of equal seg_lo
        int n = 0;
        for (int i = 0; i < BT && tok0 + i < n_tok; i++) {
            int lo = seg_lo[tok0 + i], hi = min(n_kv, q_slot[tok0 + i] + 1);
            if (n > 0 && s_seg_lo[n - 1] == lo) s_seg_hi[n - 1] = max(s_seg_hi[n - 1], hi);
            else s_seg_lo[n] = lo, s_seg_hi[n] = hi, n++;
        }
        s_nseg = n;
    }
    // Q rows, scaled and rounded to f16 (rows past the batch are zeros)
    for (int c = tid; c < FA_ROWS * (HD / 4); c += blockDim.x) {
        int r = c / (HD / 4), d = (c % (HD / 4)) * 4, tk = tok0 + r / G;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r < BT * G && tk < n_tok)
            v = *reinterpret_cast<const float4*>(q + ((long)tk * n_head + kvh * G + r % G) * HD + d);
        *reinterpret_cast<uint2*>(Qs + r * LD + d) =
            make_uint2(rx_pack_h2(v.x * scale, v.y * scale), rx_pack_h2(v.z * scale, v.w * scale));
    }
    __syncthreads();
    const int j_hi = s_hi, n_seg = segments ? s_nseg : 0;
    int j_lo = j_hi;
    for (int i = 0; i < n_seg; i++) j_lo = min(j_lo, s_seg_lo[i]);
    if (!segments) j_lo = 0;
    if (window > 0) {  // every slot before the first with kv_pos > min(pos) - window is outside every row's window
        if (tid == 0) s_lo = j_hi;
        __syncthreads();
        for (int base = j_lo; base < j_hi; base += blockDim.x) {
            int j = base + tid;
            bool found = j < j_hi && kv_pos[j] > s_minpos - window;
            if (found) atomicMin(&s_lo, j);
            if (__syncthreads_or(found)) break;
        }
        __syncthreads();
        j_lo = s_lo;
    }
    int w_hi = max(r_nvis[0], r_nvis[1]);  // the warp's last visible slot + 1
    // and its first (segments: its rows' lowest seg_lo; rows past the batch see nothing)
    int w_lo = segments ? min(r_nvis[0] > 0 ? r_lo[0] : 0x7fffffff, r_nvis[1] > 0 ? r_lo[1] : 0x7fffffff) : 0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        w_hi = max(w_hi, __shfl_xor_sync(0xffffffffu, w_hi, o));
        w_lo = min(w_lo, __shfl_xor_sync(0xffffffffu, w_lo, o));
    }

    auto load_tile = [&](half* dst, const half* cache, int j0) {
        for (int c = tid; c < BKV * (HD / 8); c += blockDim.x) {
            int r = c / (HD / 8), d = (c % (HD / 8)) * 8, j = j0 + r;
            bool ok = j < j_hi;
            if (segments && ok) {
                ok = false;
                for (int i = 0; i < n_seg; i++) ok |= j >= s_seg_lo[i] && j < s_seg_hi[i];
            }
            rx_cp16(dst + r * LD + d, cache + ((long)kvh * n_rows + rx_kv_row(kv_blocks, ok ? j : 0)) * HD + d, ok ? 16 : 0);
        }
    };

    float o_acc[ND][4];
#pragma unroll
    for (int i = 0; i < ND; i++)
#pragma unroll
        for (int c = 0; c < 4; c++) o_acc[i][c] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

    if (j_lo < j_hi) load_tile(Ks, k_cache, j_lo);
    rx_cp_commit();
    for (int j0 = j_lo; j0 < j_hi; j0 += BKV) {
        load_tile(Vs, v_cache, j0);
        rx_cp_commit();
        rx_cp_wait<1>();  // K(j0) landed (V(j0) may still be in flight)
        __syncthreads();
        const bool active = j0 < w_hi && j0 + BKV > w_lo;  // warp-uniform
        float s[NB][4];
        if (active) {
#pragma unroll
            for (int nb = 0; nb < NB; nb++)
#pragma unroll
                for (int c = 0; c < 4; c++) s[nb][c] = 0.f;
#pragma unroll
            for (int kd = 0; kd < KD; kd++) {
                uint32_t a[4];
                rx_ldsm4(a, Qs + (warp * 16 + (lane & 15)) * LD + kd * 16 + (lane >> 4) * 8);
#pragma unroll
                for (int nb = 0; nb < NB; nb += 2) {
                    uint32_t b[4];
                    rx_ldsm4(b, Ks + (nb * 8 + (lane & 7) + ((lane >> 4) << 3)) * LD + kd * 16 + ((lane >> 3) & 1) * 8);
                    rx_mma(s[nb], a[0], a[1], a[2], a[3], b[0], b[1]);
                    rx_mma(s[nb + 1], a[0], a[1], a[2], a[3], b[2], b[3]);
                }
            }
            // mask (and soft-cap), to the log2 domain
#pragma unroll
            for (int nb = 0; nb < NB; nb++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    int h = c >> 1, j = j0 + nb * 8 + 2 * t + (c & 1);
                    float x = s[nb][c];
                    if (softcap > 0.f) x = softcap * tanhf(x / softcap);
                    bool vis = j < r_nvis[h] && (j < prefix_len || j >= r_lo[h]) &&
                               (window <= 0 || r_pos[h] - kv_pos[j] < window);
                    s[nb][c] = vis ? x * LOG2E : -INFINITY;
                }
            // online softmax: rescale the running sums to the new row maxima
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float mx = -INFINITY;
#pragma unroll
                for (int nb = 0; nb < NB; nb++) mx = fmaxf(mx, fmaxf(s[nb][2 * h], s[nb][2 * h + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                float m_new = fmaxf(m_run[h], mx);
                float m_use = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing visible yet stays at 0
                float corr = exp2f(m_run[h] - m_use);
                m_run[h] = m_new;
                float sum = 0.f;
#pragma unroll
                for (int nb = 0; nb < NB; nb++) {
                    s[nb][2 * h] = exp2f(s[nb][2 * h] - m_use);
                    s[nb][2 * h + 1] = exp2f(s[nb][2 * h + 1] - m_use);
                    sum += s[nb][2 * h] + s[nb][2 * h + 1];
                }
                l_run[h] = l_run[h] * corr + sum;  // this thread's columns; the quad is summed at the end
#pragma unroll
                for (int d = 0; d < ND; d++) o_acc[d][2 * h] *= corr, o_acc[d][2 * h + 1] *= corr;
            }
        }
        __syncthreads();  // every warp is done with K(j0)
        if (j0 + BKV < j_hi) load_tile(Ks, k_cache, j0 + BKV);
        rx_cp_commit();
        rx_cp_wait<1>();  // V(j0) landed
        __syncthreads();
        if (active) {
#pragma unroll
            for (int kt = 0; kt < BKV / 16; kt++) {
                uint32_t a0 = rx_pack_h2(s[2 * kt][0], s[2 * kt][1]), a1 = rx_pack_h2(s[2 * kt][2], s[2 * kt][3]);
                uint32_t a2 = rx_pack_h2(s[2 * kt + 1][0], s[2 * kt + 1][1]);
                uint32_t a3 = rx_pack_h2(s[2 * kt + 1][2], s[2 * kt + 1][3]);
#pragma unroll
                for (int dt = 0; dt < ND; dt += 2) {
                    uint32_t b[4];
                    rx_ldsm4_t(b, Vs + (kt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dt * 8 + (lane >> 4) * 8);
                    rx_mma(o_acc[dt], a0, a1, a2, a3, b[0], b[1]);
                    rx_mma(o_acc[dt + 1], a0, a1, a2, a3, b[2], b[3]);
                }
            }
        }
        __syncthreads();  // every warp is done with V(j0) before the next tile's V lands there
    }
    rx_cp_wait<0>();
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float l = l_run[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        if (r_tok[h] < 0) continue;
        float inv = l > 0.f ? 1.f / l : 0.f;
        float* dst = out + ((long)r_tok[h] * n_head + r_head[h]) * HD + 2 * t;
#pragma unroll
        for (int d = 0; d < ND; d++)
            *reinterpret_cast<float2*>(dst + d * 8) = make_float2(o_acc[d][2 * h] * inv, o_acc[d][2 * h + 1] * inv);
    }
#else
    __trap();  // never launched below sm_80 (gpu/ops/flash_attn.py ok); fail loudly if it were
#endif
}

#define RX_FLASH(HD)                                                                                                  \
    extern "C" __global__ void __launch_bounds__(128) reflex_flash_attn_##HD(                                        \
        const float* q, const half* k_cache, const half* v_cache, const int* kv_pos, const int* q_pos,               \
        const int* q_slot, const int* seg_lo, int prefix_len, const int* n_kv, float* out, int n_tok, int n_head,    \
        int n_head_kv, int n_rows, int window, float scale, float softcap, const int* kv_blocks) {                   \
        rx_pdl_begin();                                                                                               \
        flash_attn<HD>(q, k_cache, v_cache, kv_pos, q_pos, q_slot, seg_lo, prefix_len, n_kv, out, n_tok, n_head,      \
                       n_head_kv, n_rows, window, scale, softcap, kv_blocks);                                         \
    }

RX_FLASH(64)
RX_FLASH(128)
RX_FLASH(256)
