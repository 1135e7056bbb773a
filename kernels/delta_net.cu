// delta_net.cu: the Gated DeltaNet ("linear attention") layers of Qwen3.5, after their input
// projections (the matrix kernels) wrote per token: qkv (C = 2 nk dk + nv dv channels, [q heads |
// k heads | v heads]), z (nv dv), alpha and beta (nv).
//
//   reflex_dn_conv        causal depthwise conv of each channel over its last K inputs (the K-1
//                         before a sequence's first token come from the rolling state), SiLU, and
//                         the L2 norm of every q and k head (q also times 1/sqrt(dk)).
//                         Grid (2 nk + nv heads, ceil(n_tok / 8)), 256 threads: one warp per
//                         (token, head). With roll = 1 (every sequence is one token: decode) the
//                         warp also rolls the state of its channels.
//   reflex_dn_conv_state  the rolling state <- the last K-1 inputs of each sequence, after
//                         reflex_dn_conv of a batch with longer sequences. Grid (ceil(C/256), n_seq).
//   reflex_dn_recurrent   the gated delta rule token by token, per (value head, sequence) block of
//                         256 threads holding the head's (dk x dv) state in registers, with the
//                         gates and the gated output norm fused:
//                           beta = sigmoid(beta), g = ssm_a * softplus(alpha + dt_bias),
//                           S <- exp(g) S;  d = beta (v - S^T k);  S <- S + k d^T;  o = S^T q,
//                           out = rmsnorm(o) * norm_w * silu(z)    (rmsnorm over the head's dv)
//   reflex_dn_prep        what of a chunk does not depend on the state, for every chunk and head
//                         at once (prompts): T = (I + A)^-1, P and the gates below, into a scratch
//                         slot per (chunk, head), so the serial part per chunk is only products.
//   reflex_dn_chunked     the same rule DN_CHUNK tokens at a time with matrix products (prompts),
//                         per (value head, DN_CV state columns, sequence) block, chunk after chunk,
//                         each chunk's inputs loaded while the one before computes; its
//                         unnormalized o then goes through reflex_dn_gated_norm. Within a chunk with
//                         cumulative log-decay c_i and start state S0 (families/qwen35/delta_net.py):
//                           D = T beta (V - exp(c) K S0),  A_ij = beta_i e^(c_i - c_j) k_i.k_j (j < i)
//                           O = exp(c) Q S0 + P D,          P_ij = e^(c_i - c_j) q_i.k_j   (j <= i)
//                           S_end = e^(c_L) S0 + sum_j e^(c_L - c_j) k_j D_j^T
//                         Every factor e^(..) is <= 1: no overflow however strong the decay.
//                         Batches of many sequences run as groups of them (gpu/ops/delta_net.py),
//                         sequence s_base + blockIdx.z, scratch slots numbered within the group.
//
// State per layer and sequence slot (slot s at state + s * stride floats): conv (K-1, C), delta
// rule (nv, dk, dv). A batch holds n_seq independent sequences, [seq_start[s], seq_start[s+1])
// (seq_start NULL: one sequence of all n_tok tokens) and sequence s uses slot slots[s] (slots NULL:
// slot s; continuous batching gives each running sequence its own slot). A sequence whose
// first token is at position 0 starts from zero state (a new request): nothing resets the arena.
// Value head h reads key head h % nk (the converter's tiled order).
// Limits (checked on the host): dk, dv <= 128; K <= DN_MAX_K.
// Bound by: decode, reading and writing the f32 state once (nv dk dv 8 bytes per layer); prompts,
// the chunked form's f32 math on CUDA cores (~4 (dk dv + DN_CHUNK (dk + dv)) flops per token and head).
#include "common.cuh"

#define DN_MAX_K 8
#define DN_MAX_HD 128
#define DN_CHUNK 32  // tokens per chunk: one per lane of a warp (the decay scan)
#define DN_CV 16     // state columns per block of the chunked kernel
// One (chunk, head) slot of reflex_dn_prep's scratch: T[32][32] | P[32][32] | beta | e^c | e^(c_L - c) | 0
#define DN_PREP_T 0
#define DN_PREP_P (DN_CHUNK * DN_CHUNK)
#define DN_PREP_G (2 * DN_CHUNK * DN_CHUNK)
#define DN_PREP_FLOATS (2 * DN_CHUNK * DN_CHUNK + 4 * DN_CHUNK)
// A chunk's slot: its sequence plus its first token / DN_CHUNK, distinct over the batch's chunks
// (a sequence's next chunk starts DN_CHUNK tokens later; the next sequence one index further on)
// and below n_seq + ceil(n_tok / DN_CHUNK), the host's bound on the scratch.
__device__ __forceinline__ long dn_prep_slot(int s, int c0, int h, int nv) {
    return ((long)(s + c0 / DN_CHUNK) * nv + h) * DN_PREP_FLOATS;
}

__device__ __forceinline__ float dn_sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

__device__ __forceinline__ float dn_softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }

__device__ __forceinline__ float dn_silu(float x) { return x / (1.f + expf(-x)); }

// The sequence holding batch token t: the largest s with seq_start[s] <= t.
__device__ __forceinline__ int dn_seq_of(const int* seq_start, int n_seq, int t) {
    if (!seq_start) return 0;
    int lo = 0, hi = n_seq - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (seq_start[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

extern "C" __global__ void __launch_bounds__(256) reflex_dn_conv(
    const float* x, const float* w, float* state, long state_stride, const int* slots, const int* seq_start, int n_seq,
    const int* pos, float* out, int n_tok, int K, int nk, int nv, int dk, int dv, float q_scale, float eps, int roll) {
    rx_pdl_begin();
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int t = blockIdx.y * 8 + warp;
    if (t >= n_tok) return;  // warps are independent: no block barrier below
    int C = 2 * nk * dk + nv * dv;
    int h = blockIdx.x;
    bool qk = h < 2 * nk;
    int c0 = qk ? h * dk : 2 * nk * dk + (h - 2 * nk) * dv;
    int hd = qk ? dk : dv;
    int s = dn_seq_of(seq_start, n_seq, t);
    int lo = seq_start ? seq_start[s] : 0;
    bool fresh = pos[lo] == 0;
    float* st = state + (long)(slots ? slots[s] : s) * state_stride;  // (K-1, C)
    int r = t - lo;  // the token's index in its sequence
    float v[DN_MAX_HD / 32];
    float ss = 0.f;
#pragma unroll
    for (int m = 0; m < DN_MAX_HD / 32; m++) {
        int c = lane + 32 * m;
        v[m] = 0.f;
        if (c < hd) {
            int ch = c0 + c;
            float acc = 0.f;
            for (int j = 0; j < K; j++) {
                int i = r + j - (K - 1);  // input index in the sequence; < 0: state row K-1+i
                float xin = i >= 0 ? x[(long)(lo + i) * C + ch] : (fresh ? 0.f : st[(long)(K - 1 + i) * C + ch]);
                acc += w[(long)ch * K + j] * xin;
            }
            v[m] = dn_silu(acc);
            ss += v[m] * v[m];
        }
    }
    float scale = 1.f;
    if (qk) scale = rsqrtf(warp_sum(ss) + eps) * (h < nk ? q_scale : 1.f);
#pragma unroll
    for (int m = 0; m < DN_MAX_HD / 32; m++) {
        int c = lane + 32 * m;
        if (c < hd) out[(long)t * C + c0 + c] = v[m] * scale;
    }
    if (!roll || K < 2) return;
    // This token is its sequence's only one: shift its channels' state by one input (each lane
    // owns its channels; every read above came first).
    for (int m = 0; m < DN_MAX_HD / 32; m++) {
        int c = lane + 32 * m;
        if (c >= hd) continue;
        int ch = c0 + c;
        for (int i = 0; i + 1 < K - 1; i++) st[(long)i * C + ch] = fresh ? 0.f : st[(long)(i + 1) * C + ch];
        st[(long)(K - 2) * C + ch] = x[(long)t * C + ch];
    }
}

extern "C" __global__ void __launch_bounds__(256) reflex_dn_conv_state(const float* x, float* state, long state_stride,
                                                                        const int* slots, const int* seq_start, int n_seq,
                                                                        const int* pos, int n_tok, int C, int K) {
    rx_pdl_begin();
    int ch = blockIdx.x * blockDim.x + threadIdx.x, s = blockIdx.y;
    if (ch >= C || K < 2) return;
    int lo = seq_start ? seq_start[s] : 0, hi = seq_start ? seq_start[s + 1] : n_tok;
    int n = hi - lo;
    bool fresh = pos[lo] == 0;
    float* st = state + (long)(slots ? slots[s] : s) * state_stride;
    float old[DN_MAX_K];
    for (int i = 0; i < K - 1; i++) old[i] = fresh ? 0.f : st[(long)i * C + ch];
    // new row i = input n + i of [old state; the sequence's inputs]
    for (int i = 0; i < K - 1; i++) {
        int k = n + i;
        st[(long)i * C + ch] = k < K - 1 ? old[k] : x[(long)(lo + k - (K - 1)) * C + ch];
    }
}

#define DN_ROWS (DN_MAX_HD / 8)   // state rows per thread (8 warps)
#define DN_COLS (DN_MAX_HD / 32)  // state columns per thread

extern "C" __global__ void __launch_bounds__(256) reflex_dn_recurrent(
    const float* qkv, const float* alpha, const float* beta, const float* z, const float* ssm_a, const float* dt_bias,
    const float* norm_w, float* state, long state_stride, const int* slots, const int* seq_start, int n_seq,
    const int* pos, float* out, int n_tok, int nk, int nv, int dk, int dv, float eps) {
    rx_pdl_begin();
    __shared__ float qs[DN_MAX_HD], ks[DN_MAX_HD];
    __shared__ float red[8][DN_MAX_HD], red2[8][DN_MAX_HD];
    int h = blockIdx.x, s = blockIdx.y;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int kh = h % nk, C = 2 * nk * dk + nv * dv;
    int lo = seq_start ? seq_start[s] : 0, hi = seq_start ? seq_start[s + 1] : n_tok;
    bool fresh = pos[lo] == 0;
    float* S = state + (long)(slots ? slots[s] : s) * state_stride + (long)h * dk * dv;
    // Thread (warp, lane) holds S[i][j] for rows i = warp + 8 r and columns j = lane + 32 c.
    float st[DN_COLS][DN_ROWS];
#pragma unroll
    for (int c = 0; c < DN_COLS; c++)
#pragma unroll
        for (int r = 0; r < DN_ROWS; r++) {
            int i = warp + 8 * r, j = lane + 32 * c;
            st[c][r] = (!fresh && i < dk && j < dv) ? S[(long)i * dv + j] : 0.f;
        }
    float a = ssm_a[h], bias = dt_bias[h];
    for (int t = lo; t < hi; t++) {
        const float* row = qkv + (long)t * C;
        for (int i = threadIdx.x; i < DN_MAX_HD; i += blockDim.x) {
            qs[i] = i < dk ? row[kh * dk + i] : 0.f;
            ks[i] = i < dk ? row[nk * dk + kh * dk + i] : 0.f;
        }
        float decay = expf(a * dn_softplus(alpha[(long)t * nv + h] + bias));
        float b = dn_sigmoid(beta[(long)t * nv + h]);
        __syncthreads();
        // kv_j = sum_i (decayed S)_ij k_i: partial over this warp's rows
#pragma unroll
        for (int c = 0; c < DN_COLS; c++) {
            float p = 0.f;
#pragma unroll
            for (int r = 0; r < DN_ROWS; r++) {
                st[c][r] *= decay;
                p += st[c][r] * ks[warp + 8 * r];
            }
            red[warp][lane + 32 * c] = p;
        }
        __syncthreads();
        // d_j = beta (v_j - kv_j); S += k d^T; o_j = sum_i S_ij q_i (partial over this warp's rows)
#pragma unroll
        for (int c = 0; c < DN_COLS; c++) {
            int j = lane + 32 * c;
            float kv = 0.f;
#pragma unroll
            for (int w8 = 0; w8 < 8; w8++) kv += red[w8][j];
            float vj = j < dv ? row[2 * nk * dk + h * dv + j] : 0.f;
            float d = b * (vj - kv);
            float p = 0.f;
#pragma unroll
            for (int r = 0; r < DN_ROWS; r++) {
                st[c][r] += ks[warp + 8 * r] * d;
                p += st[c][r] * qs[warp + 8 * r];
            }
            red2[warp][j] = p;
        }
        __syncthreads();
        if (warp == 0) {  // gated RMS norm of the head's output, written out
            float o[DN_COLS];
            float ss = 0.f;
#pragma unroll
            for (int c = 0; c < DN_COLS; c++) {
                int j = lane + 32 * c;
                o[c] = 0.f;
#pragma unroll
                for (int w8 = 0; w8 < 8; w8++) o[c] += red2[w8][j];
                if (j < dv) ss += o[c] * o[c];
            }
            float inv = rsqrtf(warp_sum(ss) / dv + eps);
            long base = ((long)t * nv + h) * dv;
#pragma unroll
            for (int c = 0; c < DN_COLS; c++) {
                int j = lane + 32 * c;
                if (j < dv) out[base + j] = o[c] * inv * norm_w[j] * dn_silu(z[base + j]);
            }
        }
        __syncthreads();  // qs, ks, red, red2 are rewritten by the next token
    }
#pragma unroll
    for (int c = 0; c < DN_COLS; c++)
#pragma unroll
        for (int r = 0; r < DN_ROWS; r++) {
            int i = warp + 8 * r, j = lane + 32 * c;
            if (i < dk && j < dv) S[(long)i * dv + j] = st[c][r];
        }
}

// One warp's dot products of row vector `a` (held as a[lane + 32 m] in registers, shuffled out)
// with rows Bs[lane] of a shared matrix: returns sum_d a[d] * Bs[lane][d] for d < n.
__device__ __forceinline__ float dn_dot_rows(const float (&a)[DN_MAX_HD / 32], const float (*Bs)[DN_MAX_HD + 1], int n) {
    int lane = threadIdx.x & 31;
    float acc = 0.f;
#pragma unroll
    for (int m = 0; m < DN_MAX_HD / 32; m++) {
        if (32 * m >= n) break;
#pragma unroll 8
        for (int dd = 0; dd < 32; dd++) acc += __shfl_sync(0xffffffffu, a[m], dd) * Bs[lane][32 * m + dd];
    }
    return acc;
}

// One chunk's gates, one token per lane of a warp: b = sigmoid(beta_t), g = the cumulative
// log-decay sum_{t' <= t} a softplus(alpha_t' + bias) by a shuffle scan, last = the chunk's total.
__device__ __forceinline__ void dn_chunk_gates(float a, float bias, const float* alpha, const float* beta, int c0,
                                               int L, int nv, int h, int lane, float& g, float& b, float& last) {
    g = 0.f, b = 0.f;
    if (lane < L) {
        g = a * dn_softplus(alpha[(long)(c0 + lane) * nv + h] + bias);
        b = dn_sigmoid(beta[(long)(c0 + lane) * nv + h]);
    }
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        float y = __shfl_up_sync(0xffffffffu, g, o);
        if (lane >= o) g += y;
    }
    last = __shfl_sync(0xffffffffu, g, L - 1);
}

// A and P of one chunk: warp w fills rows i = w + 8 m, lane j the column: A_ij = beta_i e_ij
// k_i.k_j below the diagonal (into shared A), P_ij = e_ij q_i.k_j (into the scratch slot's P), e_ij
// the decay from j to i. The row's q and k vectors are held in registers (one element per lane)
// and shuffled to every lane.
__device__ __forceinline__ void dn_chunk_ap(const float* qkv, int C, int qoff, int c0, int L, int dk,
                                            const float (*Ks)[DN_MAX_HD + 1], const float* cum, const float* bet,
                                            float (*A)[DN_CHUNK + 1], float* P) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int m = 0; m < DN_CHUNK / 8; m++) {
        int i = warp + 8 * m;
        float qr[DN_MAX_HD / 32], kr[DN_MAX_HD / 32];
#pragma unroll
        for (int u = 0; u < DN_MAX_HD / 32; u++) {
            int d = lane + 32 * u;
            qr[u] = (i < L && d < dk) ? qkv[(long)(c0 + i) * C + qoff + d] : 0.f;
            kr[u] = Ks[i][d];
        }
        float kk = dn_dot_rows(kr, Ks, dk), qk = dn_dot_rows(qr, Ks, dk);
        int j = lane;
        float e = (i < L && j <= i) ? expf(cum[i] - cum[j]) : 0.f;
        A[i][j] = j < i ? bet[i] * e * kk : 0.f;
        P[i * DN_CHUNK + j] = e * qk;
    }
}

// Forward substitution down one column (`lane`) of X: X_i -= sum_{j<i} A_ij X_j for i = 1..n-1, A
// unit lower triangular (its diagonal implied). Four partial sums: the chain of dependent adds is the
// serial part of the prompt rule.
__device__ __forceinline__ void dn_forward_subst(const float (*A)[DN_CHUNK + 1], float (*X)[DN_CHUNK + 1], int n,
                                                 int lane) {
    for (int i = 1; i < n; i++) {
        float a0 = X[i][lane], a1 = 0.f, a2 = 0.f, a3 = 0.f;
        int j = 0;
        for (; j + 4 <= i; j += 4) {
            a0 -= A[i][j] * X[j][lane];
            a1 -= A[i][j + 1] * X[j + 1][lane];
            a2 -= A[i][j + 2] * X[j + 2][lane];
            a3 -= A[i][j + 3] * X[j + 3][lane];
        }
        for (; j < i; j++) a0 -= A[i][j] * X[j][lane];
        X[i][lane] = (a0 + a1) + (a2 + a3);
    }
}

// Grid (nv, ceil(n_tok / DN_CHUNK), n_seq of this group), 256 threads: chunk blockIdx.y of sequence
// s_base + blockIdx.z (blocks past their sequence's end return). The gates, A and P, then warp 0
// solves (I + A) T = I, a column per lane: the forward substitution's serial chain runs beside
// every other chunk's instead of chunk after chunk.
extern "C" __global__ void __launch_bounds__(256) reflex_dn_prep(const float* qkv, const float* alpha,
                                                                  const float* beta, const float* ssm_a,
                                                                  const float* dt_bias, const int* seq_start,
                                                                  int s_base, float* prep, int n_tok, int nk, int nv,
                                                                  int dk, int dv) {
    rx_pdl_begin();
    __shared__ float Ks[DN_CHUNK][DN_MAX_HD + 1];
    __shared__ float A[DN_CHUNK][DN_CHUNK + 1];
    __shared__ float Ts[DN_CHUNK][DN_CHUNK + 1];
    __shared__ float bet[DN_CHUNK], cum[DN_CHUNK];
    int h = blockIdx.x, z = blockIdx.z, s = s_base + z, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int lo = seq_start ? seq_start[s] : 0, hi = seq_start ? seq_start[s + 1] : n_tok;
    int c0 = lo + blockIdx.y * DN_CHUNK;
    if (c0 >= hi) return;
    int L = min(DN_CHUNK, hi - c0);
    int kh = h % nk, C = 2 * nk * dk + nv * dv, qoff = kh * dk, koff = nk * dk + kh * dk;
    float* out = prep + dn_prep_slot(z, c0, h, nv);
#pragma unroll  // a fixed count: every load issued before the first store waits
    for (int u = 0; u < DN_CHUNK * DN_MAX_HD / 256; u++) {
        int idx = threadIdx.x + 256 * u, t = idx / DN_MAX_HD, i = idx % DN_MAX_HD;
        Ks[t][i] = (t < L && i < dk) ? qkv[(long)(c0 + t) * C + koff + i] : 0.f;
    }
    if (warp == 0) {  // gates; cumulative log-decay
        float g, b, last;
        dn_chunk_gates(ssm_a[h], dt_bias[h], alpha, beta, c0, L, nv, h, lane, g, b, last);
        bet[lane] = b, cum[lane] = g;
        out[DN_PREP_G + lane] = b;
        out[DN_PREP_G + DN_CHUNK + lane] = lane < L ? expf(g) : 0.f;
        out[DN_PREP_G + 2 * DN_CHUNK + lane] = lane < L ? expf(last - g) : 0.f;
        out[DN_PREP_G + 3 * DN_CHUNK + lane] = 0.f;
    }
    __syncthreads();
    dn_chunk_ap(qkv, C, qoff, c0, L, dk, Ks, cum, bet, A, out + DN_PREP_P);
    __syncthreads();
    if (warp == 0) {  // column `lane` of T = (I + A)^-1: the identity's column, substituted (rows past L: identity)
        for (int i = 0; i < DN_CHUNK; i++) Ts[i][lane] = i == lane ? 1.f : 0.f;
        dn_forward_subst(A, Ts, DN_CHUNK, lane);
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < DN_CHUNK * DN_CHUNK; idx += blockDim.x)
        out[DN_PREP_T + idx] = Ts[idx / DN_CHUNK][idx % DN_CHUNK];
}

// The chunked kernel's thread layout (256 threads, DN_CV state columns a block): thread x owns
// column x % DN_CV and, through its half-warp index hw = x / DN_CV, the chunk's tokens
// DN_TPT hw .. (the output and D) and the state rows DN_RPT hw .. (the state update).
#define DN_TPT (DN_CHUNK * DN_CV / 256)
#define DN_RPT (DN_MAX_HD * DN_CV / 256)
#define DN_TILE_PT (DN_CHUNK * DN_MAX_HD / 256)  // a chunk's key (and query) floats a thread fetches
#define DN_TP_PT (DN_CHUNK * DN_CHUNK / 256)     // ... and T (and P) floats
// Shared memory (floats): keys, queries [DN_CHUNK][DN_MAX_HD]; the state's block columns
// [DN_MAX_HD][DN_CV]; T, P [DN_CHUNK][DN_CHUNK]; D [DN_CHUNK][DN_CV]; beta, e^c, e^(c_L - c).
#define DN_CHUNKED_SMEM (4 * (2 * DN_CHUNK * DN_MAX_HD + DN_MAX_HD * DN_CV + 2 * DN_CHUNK * DN_CHUNK + \
                              DN_CHUNK * DN_CV + 3 * DN_CHUNK))

// One chunk's inputs as registers: a chunk's loads are issued while the chunk before it computes,
// so the chain of chunks waits on no global read. Thread x holds the key and query tile elements
// x + 256 u (token (x + 256 u) / DN_MAX_HD), the T and P elements x + 256 u, its tokens' values in
// its column, and (warp 0's lanes) the gates of token `lane`.
struct DnChunkIn {
    float k[DN_TILE_PT], q[DN_TILE_PT], t[DN_TP_PT], p[DN_TP_PT], v[DN_TPT], bet, ecum, tail;
};

__device__ __forceinline__ void dn_fetch(DnChunkIn& f, const float* qkv, int C, int qoff, int koff, int vcol,
                                         bool col_ok, int c0, int L, int dk, const float* pc) {
    int x = threadIdx.x, i = x % DN_MAX_HD, t0 = x / DN_MAX_HD, tok = (x / DN_CV) * DN_TPT;
#pragma unroll
    for (int u = 0; u < DN_TILE_PT; u++) {
        int t = t0 + u * (256 / DN_MAX_HD);
        bool ok = t < L && i < dk;
        f.k[u] = ok ? qkv[(long)(c0 + t) * C + koff + i] : 0.f;
        f.q[u] = ok ? qkv[(long)(c0 + t) * C + qoff + i] : 0.f;
    }
#pragma unroll
    for (int u = 0; u < DN_TP_PT; u++) {
        f.t[u] = pc[DN_PREP_T + x + 256 * u];
        f.p[u] = pc[DN_PREP_P + x + 256 * u];
    }
#pragma unroll
    for (int m = 0; m < DN_TPT; m++) f.v[m] = (tok + m < L && col_ok) ? qkv[(long)(c0 + tok + m) * C + vcol] : 0.f;
    if (x < DN_CHUNK) {
        f.bet = pc[DN_PREP_G + x];
        f.ecum = pc[DN_PREP_G + DN_CHUNK + x];
        f.tail = pc[DN_PREP_G + 2 * DN_CHUNK + x];
    }
}

__device__ __forceinline__ float dn_dot4(float4 a, float b0, float b1, float b2, float b3, float acc) {
    return fmaf(a.w, b3, fmaf(a.z, b2, fmaf(a.y, b1, fmaf(a.x, b0, acc))));
}

// Grid (nv, ceil(dv / DN_CV), n_seq of this group), 256 threads, DN_CHUNKED_SMEM bytes of dynamic
// shared memory: the delta rule of sequence s_base + blockIdx.z for value head blockIdx.x and
// state columns DN_CV blockIdx.y .., chunk after chunk, from reflex_dn_prep's slots (T, P, gates).
// out gets o unnormalized (reflex_dn_gated_norm follows).
extern "C" __global__ void __launch_bounds__(256, 2) reflex_dn_chunked(
    const float* qkv, float* state, long state_stride, const int* slots, const int* seq_start, int s_base,
    const int* pos, float* out, int n_tok, int nk, int nv, int dk, int dv, const float* prep) {
    rx_pdl_begin();
    extern __shared__ __align__(16) unsigned char rx_smem[];
    float(*Ks)[DN_MAX_HD] = reinterpret_cast<float(*)[DN_MAX_HD]>(rx_smem);
    float(*Qs)[DN_MAX_HD] = Ks + DN_CHUNK;
    float(*Ss)[DN_CV] = reinterpret_cast<float(*)[DN_CV]>(Qs + DN_CHUNK);
    float(*Ts)[DN_CHUNK] = reinterpret_cast<float(*)[DN_CHUNK]>(Ss + DN_MAX_HD);
    float(*Ps)[DN_CHUNK] = Ts + DN_CHUNK;
    float(*D)[DN_CV] = reinterpret_cast<float(*)[DN_CV]>(Ps + DN_CHUNK);
    float* bet = D[DN_CHUNK];
    float *ecum = bet + DN_CHUNK, *tail = ecum + DN_CHUNK;
    int h = blockIdx.x, j0 = blockIdx.y * DN_CV, z = blockIdx.z, s = s_base + z, x = threadIdx.x;
    int col = x % DN_CV, hw = x / DN_CV, tok = hw * DN_TPT, row = hw * DN_RPT;
    int kh = h % nk, C = 2 * nk * dk + nv * dv;
    int qoff = kh * dk, koff = nk * dk + kh * dk, vcol = 2 * nk * dk + h * dv + j0 + col;
    int lo = seq_start ? seq_start[s] : 0, hi = seq_start ? seq_start[s + 1] : n_tok;
    bool fresh = pos[lo] == 0, col_ok = j0 + col < dv;
    float* Sg = state + (long)(slots ? slots[s] : s) * state_stride + (long)h * dk * dv;
#pragma unroll
    for (int r = 0; r < DN_RPT; r++)
        Ss[row + r][col] = (!fresh && row + r < dk && col_ok) ? Sg[(long)(row + r) * dv + j0 + col] : 0.f;
    DnChunkIn f;
    if (lo < hi) dn_fetch(f, qkv, C, qoff, koff, vcol, col_ok, lo, min(DN_CHUNK, hi - lo), dk, prep + dn_prep_slot(z, lo, h, nv));
    for (int c0 = lo; c0 < hi; c0 += DN_CHUNK) {
        int L = min(DN_CHUNK, hi - c0);
        // this chunk into shared memory (and its values kept), then the next chunk's loads issued
#pragma unroll
        for (int u = 0; u < DN_TILE_PT; u++) {
            int t = x / DN_MAX_HD + u * (256 / DN_MAX_HD);
            Ks[t][x % DN_MAX_HD] = f.k[u];
            Qs[t][x % DN_MAX_HD] = f.q[u];
        }
#pragma unroll
        for (int u = 0; u < DN_TP_PT; u++) {
            (&Ts[0][0])[x + 256 * u] = f.t[u];
            (&Ps[0][0])[x + 256 * u] = f.p[u];
        }
        if (x < DN_CHUNK) bet[x] = f.bet, ecum[x] = f.ecum, tail[x] = f.tail;
        float v[DN_TPT];
#pragma unroll
        for (int m = 0; m < DN_TPT; m++) v[m] = f.v[m];
        int n0 = c0 + DN_CHUNK;
        if (n0 < hi)
            dn_fetch(f, qkv, C, qoff, koff, vcol, col_ok, n0, min(DN_CHUNK, hi - n0), dk, prep + dn_prep_slot(z, n0, h, nv));
        __syncthreads();
        // K S0 and Q S0 for this thread's tokens and column (key / query elements past dk are 0)
        float ks0[DN_TPT] = {}, qs0[DN_TPT] = {};
#pragma unroll 4
        for (int d = 0; d < dk; d += 4) {
            float s0 = Ss[d][col], s1 = Ss[d + 1][col], s2 = Ss[d + 2][col], s3 = Ss[d + 3][col];
#pragma unroll
            for (int m = 0; m < DN_TPT; m++) {
                ks0[m] = dn_dot4(*reinterpret_cast<const float4*>(&Ks[tok + m][d]), s0, s1, s2, s3, ks0[m]);
                qs0[m] = dn_dot4(*reinterpret_cast<const float4*>(&Qs[tok + m][d]), s0, s1, s2, s3, qs0[m]);
            }
        }
        // the right-hand side R = beta (V - e^c K S0) into D; o = e^c Q S0 (tokens past L: 0)
        float o[DN_TPT];
#pragma unroll
        for (int m = 0; m < DN_TPT; m++) {
            int t = tok + m;
            D[t][col] = t < L ? bet[t] * (v[m] - ecum[t] * ks0[m]) : 0.f;
            o[m] = t < L ? ecum[t] * qs0[m] : 0.f;
        }
        __syncthreads();
        // D = T R (T lower triangular, identity rows past L)
        float dn[DN_TPT] = {};
#pragma unroll 2
        for (int j = 0; j < DN_CHUNK; j += 4) {
            float r0 = D[j][col], r1 = D[j + 1][col], r2 = D[j + 2][col], r3 = D[j + 3][col];
#pragma unroll
            for (int m = 0; m < DN_TPT; m++)
                dn[m] = dn_dot4(*reinterpret_cast<const float4*>(&Ts[tok + m][j]), r0, r1, r2, r3, dn[m]);
        }
        __syncthreads();
#pragma unroll
        for (int m = 0; m < DN_TPT; m++) D[tok + m][col] = dn[m];
        __syncthreads();
        // O += P D for this thread's tokens; S <- e^(c_L) S + sum_j e^(c_L - c_j) k_j D_j^T for its
        // rows (D is 0 past L). Loops over j outside: one read of D_j serves every token and row.
        float e_last = ecum[L - 1], acc[DN_RPT];
#pragma unroll
        for (int r = 0; r < DN_RPT; r++) acc[r] = e_last * Ss[row + r][col];
#pragma unroll 2
        for (int j = 0; j < DN_CHUNK; j += 4) {
            float d4[4];
#pragma unroll
            for (int jj = 0; jj < 4; jj++) d4[jj] = D[j + jj][col];
#pragma unroll
            for (int m = 0; m < DN_TPT; m++)
                o[m] = dn_dot4(*reinterpret_cast<const float4*>(&Ps[tok + m][j]), d4[0], d4[1], d4[2], d4[3], o[m]);
#pragma unroll
            for (int jj = 0; jj < 4; jj++) {
                float tj = tail[j + jj] * d4[jj];
#pragma unroll
                for (int r = 0; r < DN_RPT; r += 4) {
                    float4 k4 = *reinterpret_cast<const float4*>(&Ks[j + jj][row + r]);
                    acc[r] = fmaf(k4.x, tj, acc[r]);
                    acc[r + 1] = fmaf(k4.y, tj, acc[r + 1]);
                    acc[r + 2] = fmaf(k4.z, tj, acc[r + 2]);
                    acc[r + 3] = fmaf(k4.w, tj, acc[r + 3]);
                }
            }
        }
#pragma unroll
        for (int m = 0; m < DN_TPT; m++)
            if (tok + m < L && col_ok) out[((long)(c0 + tok + m) * nv + h) * dv + j0 + col] = o[m];
#pragma unroll
        for (int r = 0; r < DN_RPT; r++) Ss[row + r][col] = acc[r];  // this thread's own cells: no one else reads them yet
        __syncthreads();  // the next chunk rewrites the tiles and reads every row of Ss
    }
#pragma unroll
    for (int r = 0; r < DN_RPT; r++)
        if (row + r < dk && col_ok) Sg[(long)(row + r) * dv + j0 + col] = Ss[row + r][col];
}

// out = rmsnorm(o) * w * silu(z) per (token, head) row of dv values; one warp per row. out may be o.
extern "C" __global__ void __launch_bounds__(256) reflex_dn_gated_norm(const float* o, const float* z, const float* w,
                                                                        float* out, int rows, int dv, float eps) {
    rx_pdl_begin();
    int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    const float* x = o + (long)row * dv;
    float ss = 0.f;
    for (int c = lane; c < dv; c += 32) ss += x[c] * x[c];
    float inv = rsqrtf(warp_sum(ss) / dv + eps);
    for (int c = lane; c < dv; c += 32) out[(long)row * dv + c] = x[c] * inv * w[c] * dn_silu(z[(long)row * dv + c]);
}
