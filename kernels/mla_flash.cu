// mla_flash.cu: DeepSeek's latent attention for a batch of query tokens on tensor cores (sm_80+):
// mla.cu's reflex_mla_attn result for prompts and system1 trees, in the same absorbed form. Every
// head reads the same latent cache rows [c (512) | k_pe (64)] in f16: the keys are whole rows
// (576 halves), the values their first 512. Decode (one token, or continuous batching's rows, each
// in its own range) stays on reflex_mla_attn and its key splits.
//
// Rows are (token, head) pairs in the absorbed queries' order (n_tok, n_head, 576 floats); a block
// takes 32 consecutive rows (whatever tokens and heads: all of them read the same cache rows) and
// walks the keys its tokens see in tiles of 64 cache rows, double-buffered with cp.async (tile i+1
// lands while tile i is computed). 256 threads = 8 warps:
//   scores  S = Q K^T, 32 x 64 per tile over 576: warp w the 16 x 16 piece at rows (w & 1) * 16,
//           keys (w >> 1) * 16 (mma.sync m16n8k16, f16 in, f32 out), masked, to the log2 domain
//   softmax the four key quarters' row maxima meet in shared memory; P = exp2(S - max) is rounded
//           to f16 into shared memory, the running sums and rescale factors per row live there too
//   values  O += P V, V = the tile's first 512 columns: warp w the 64 latent columns w * 64.. of all
//           32 rows (64 floats a thread), the same tile read again through ldmatrix.trans
// Visibility is mla.cu's rule: a row of token t sees slot j when j <= q_slot[t], j < n_kv and
// (j < prefix_len or j >= seg_lo[t]). Only slots some row of the block sees are loaded; the others
// (and slots past the last one) are zero-filled, never NaN garbage times 0.
// Blocks run the latest rows first (a causal prompt's longest key ranges start in the first wave).
// Bound by tensor-core math: 2 * (576 + 512) flops per (row, visible key).
#include "common.cuh"
#include "mma.cuh"

#define MLF_ROWS 32               // query rows per block
#define MLF_BKV 64                // keys per tile
#define MLF_D 576                 // key width: kv_lora_rank 512 + rope 64 (gpu/ops/mla_flash.py ok)
#define MLF_R 512                 // value width: the latent part of the same rows
#define MLF_LD (MLF_D + 8)        // halves per shared Q/K row: 16 bytes of padding put ldmatrix rows on distinct banks
#define MLF_LDP (MLF_BKV + 8)     // halves per shared P row
#define MLF_COLS (MLF_R / 8)      // latent columns per warp in P V
#define MLF_BYTES (((MLF_ROWS + 2 * MLF_BKV) * MLF_LD + MLF_ROWS * MLF_LDP) * 2)

// q: (n_rows = n_tok * n_head, 576) absorbed queries (float); cache: latent rows (576 halves) through
// kv_blocks; out: (n_rows, 512) floats. Dynamic shared memory: MLF_BYTES.
extern "C" __global__ void __launch_bounds__(256, 1) reflex_mla_flash(
    const float* q, const half* cache, const int* q_slot, const int* seg_lo, int prefix_len, const int* n_kv_ptr,
    float* out, int n_rows, int n_head, float scale, const int* kv_blocks) {
    rx_pdl_begin();
#if RX_SM80
    constexpr int KD = MLF_D / 16, CHUNKS = MLF_D / 8;
    constexpr float LOG2E = 1.4426950408889634f;
    extern __shared__ __align__(16) unsigned char rx_smem[];
    half* Qs = reinterpret_cast<half*>(rx_smem);
    half* Ks = Qs + MLF_ROWS * MLF_LD;  // two tiles
    half* Ps = Ks + 2 * MLF_BKV * MLF_LD;
    __shared__ float s_max[4][MLF_ROWS], s_sum[4][MLF_ROWS];  // per key quarter
    __shared__ float s_m[MLF_ROWS], s_l[MLF_ROWS], s_corr[MLF_ROWS], s_mnext[MLF_ROWS];
    __shared__ int s_hi, s_lo;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int rg = warp & 1, kg = warp >> 1;  // the score piece: rows rg * 16.., keys kg * 16..
    const int row0 = (gridDim.x - 1 - blockIdx.x) * MLF_ROWS, n_kv = *n_kv_ptr;

    int r_nvis[2], r_lo[2];  // this thread's score rows rg * 16 + g and + 8
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int R = row0 + rg * 16 + g + 8 * h, tk = R / n_head;
        r_nvis[h] = R < n_rows ? min(n_kv, q_slot[tk] + 1) : 0;
        r_lo[h] = R < n_rows && seg_lo ? seg_lo[tk] : 0;
    }
    if (warp == 0) {  // the block's last visible slot + 1, and the lowest seg_lo of rows that see any
        int R = row0 + lane, tk = R / n_head;
        int hi = R < n_rows ? min(n_kv, q_slot[tk] + 1) : 0;
        int lo = hi > 0 ? (seg_lo ? seg_lo[tk] : 0) : 0x7fffffff;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, o));
            lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
        }
        if (lane == 0) s_hi = hi, s_lo = lo;
        s_m[lane] = -INFINITY, s_l[lane] = 0.f;
    }
    // Q rows, scaled and rounded to f16 (rows past the batch are zeros)
    for (int c = tid; c < MLF_ROWS * (MLF_D / 4); c += blockDim.x) {
        int r = c / (MLF_D / 4), d = (c % (MLF_D / 4)) * 4;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (row0 + r < n_rows) v = *reinterpret_cast<const float4*>(q + (long)(row0 + r) * MLF_D + d);
        *reinterpret_cast<uint2*>(Qs + r * MLF_LD + d) =
            make_uint2(rx_pack_h2(v.x * scale, v.y * scale), rx_pack_h2(v.z * scale, v.w * scale));
    }
    __syncthreads();
    const int j_hi = s_hi, min_lo = min(s_lo, j_hi);
    const int j_start = prefix_len > 0 ? 0 : min_lo;
    const int n_tiles = j_hi > j_start ? (j_hi - j_start + MLF_BKV - 1) / MLF_BKV : 0;

    auto load_tile = [&](half* dst, int j0) {
        for (int c = tid; c < MLF_BKV * CHUNKS; c += blockDim.x) {
            int r = c / CHUNKS, d = (c % CHUNKS) * 8, j = j0 + r;
            bool ok = j < j_hi && (j < prefix_len || j >= min_lo);
            rx_cp16(dst + r * MLF_LD + d, cache + rx_kv_row(kv_blocks, ok ? j : 0) * MLF_D + d, ok ? 16 : 0);
        }
    };

    float o_acc[2][MLF_COLS / 8][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int n = 0; n < MLF_COLS / 8; n++)
#pragma unroll
            for (int c = 0; c < 4; c++) o_acc[mt][n][c] = 0.f;

    if (n_tiles > 0) load_tile(Ks, j_start);
    rx_cp_commit();
    for (int it = 0; it < n_tiles; it++) {
        const int j0 = j_start + it * MLF_BKV;
        const half* Kt = Ks + (it & 1) * MLF_BKV * MLF_LD;
        rx_cp_wait<0>();
        __syncthreads();  // tile it landed; every warp is done with tile it - 1 (its buffer is refilled next) and P
        if (it + 1 < n_tiles) load_tile(Ks + ((it + 1) & 1) * MLF_BKV * MLF_LD, j0 + MLF_BKV);
        rx_cp_commit();

        float s[2][4];
#pragma unroll
        for (int nb = 0; nb < 2; nb++)
#pragma unroll
            for (int c = 0; c < 4; c++) s[nb][c] = 0.f;
#pragma unroll 4
        for (int kd = 0; kd < KD; kd++) {
            uint32_t a[4], b[4];
            rx_ldsm4(a, Qs + (rg * 16 + (lane & 15)) * MLF_LD + kd * 16 + (lane >> 4) * 8);
            rx_ldsm4(b, Kt + (kg * 16 + (lane & 7) + ((lane >> 4) << 3)) * MLF_LD + kd * 16 + ((lane >> 3) & 1) * 8);
            rx_mma(s[0], a[0], a[1], a[2], a[3], b[0], b[1]);
            rx_mma(s[1], a[0], a[1], a[2], a[3], b[2], b[3]);
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float mx = -INFINITY;
#pragma unroll
            for (int nb = 0; nb < 2; nb++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int j = j0 + kg * 16 + nb * 8 + 2 * t + e;
                    bool vis = j < r_nvis[h] && (j < prefix_len || j >= r_lo[h]);
                    float x = vis ? s[nb][2 * h + e] * LOG2E : -INFINITY;
                    s[nb][2 * h + e] = x;
                    mx = fmaxf(mx, x);
                }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            if (t == 0) s_max[kg][rg * 16 + g + 8 * h] = mx;
        }
        __syncthreads();  // every quarter's row maxima
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = rg * 16 + g + 8 * h;
            float m_old = s_m[row];
            float m_new = fmaxf(m_old, fmaxf(fmaxf(s_max[0][row], s_max[1][row]), fmaxf(s_max[2][row], s_max[3][row])));
            float m_use = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing visible yet stays at 0
            float sum = 0.f;
#pragma unroll
            for (int nb = 0; nb < 2; nb++) {
                float p0 = exp2f(s[nb][2 * h] - m_use), p1 = exp2f(s[nb][2 * h + 1] - m_use);
                sum += p0 + p1;
                *reinterpret_cast<uint32_t*>(Ps + row * MLF_LDP + kg * 16 + nb * 8 + 2 * t) = rx_pack_h2(p0, p1);
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            if (t == 0) {
                s_sum[kg][row] = sum;
                if (kg == 0) s_corr[row] = exp2f(m_old - m_use), s_mnext[row] = m_new;
            }
        }
        __syncthreads();  // P, the sums and the factors
        if (warp == 0) {  // read by the next tile's softmax (after two more barriers) and the end
            s_l[lane] = s_l[lane] * s_corr[lane] + (s_sum[0][lane] + s_sum[1][lane]) + (s_sum[2][lane] + s_sum[3][lane]);
            s_m[lane] = s_mnext[lane];
        }
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float corr = s_corr[mt * 16 + g + 8 * h];
#pragma unroll
                for (int n = 0; n < MLF_COLS / 8; n++) o_acc[mt][n][2 * h] *= corr, o_acc[mt][n][2 * h + 1] *= corr;
            }
#pragma unroll
        for (int kt = 0; kt < MLF_BKV / 16; kt++) {
            uint32_t a[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
                rx_ldsm4(a[mt], Ps + (mt * 16 + (lane & 15)) * MLF_LDP + kt * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int dt = 0; dt < MLF_COLS / 8; dt += 2) {
                uint32_t b[4];
                rx_ldsm4_t(b, Kt + (kt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * MLF_LD + warp * MLF_COLS + dt * 8 +
                                  (lane >> 4) * 8);
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    rx_mma(o_acc[mt][dt], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[0], b[1]);
                    rx_mma(o_acc[mt][dt + 1], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[2], b[3]);
                }
            }
        }
    }
    rx_cp_wait<0>();
    __syncthreads();  // the last tile's sums
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int row = mt * 16 + g + 8 * h;
            if (row0 + row >= n_rows) continue;
            float l = s_l[row], inv = l > 0.f ? 1.f / l : 0.f;
            float* dst = out + (long)(row0 + row) * MLF_R + warp * MLF_COLS + 2 * t;
#pragma unroll
            for (int n = 0; n < MLF_COLS / 8; n++)
                *reinterpret_cast<float2*>(dst + n * 8) = make_float2(o_acc[mt][n][2 * h] * inv, o_acc[mt][n][2 * h + 1] * inv);
        }
#else
    __trap();  // never launched below sm_80 (gpu/ops/mla_flash.py ok); fail loudly if it were
#endif
}
