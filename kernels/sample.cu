// sample.cu: pick the next token on the GPU and advance the decode state, so a captured decode
// step needs nothing from the host. Semantics are docs/INTERNALS.md "Sampling", the same as
// reflex_runtime/reference/sampling.py:
//   greedy: argmax, lowest id on ties;
//   otherwise z = logits / T, keep z >= max(t_topk, t_topp) and p >= min_p, draw u = uniform(seed, step)
//   and walk the kept tokens in id order until the running mass exceeds u * kept mass.
// reflex_pick_rows does either for every row of a batch of sequences (continuous batching).
// After choosing, the single-sequence kernels write tokens[0] (the next step's input), out_tokens[step], and
// move pos/slot/n_kv one past the last token of this pass (index `last`).
#include "state.cuh"

// Phase 1: each block finds the best (value, index) of its slice.
extern "C" __global__ void __launch_bounds__(1024) reflex_argmax_partial(const float* logits, int n, float* part_v,
                                                                         int* part_i) {
    rx_pdl_begin();
    __shared__ float sv[32];
    __shared__ int si[32];
    int per = (n + gridDim.x - 1) / gridDim.x;
    int lo = blockIdx.x * per, hi = min(n, lo + per);
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        float v = logits[i];
        if (v != v) v = -INFINITY;  // NaN never wins
        if (rx_better(v, i, bv, bi)) bv = v, bi = i;
    }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (rx_better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) sv[warp] = bv, si[warp] = bi;
    __syncthreads();
    if (warp == 0) {
        int nw = blockDim.x >> 5;
        bv = lane < nw ? sv[lane] : -INFINITY;
        bi = lane < nw ? si[lane] : 0x7fffffff;
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (rx_better(ov, oi, bv, bi)) bv = ov, bi = oi;
        }
        if (lane == 0) part_v[blockIdx.x] = bv, part_i[blockIdx.x] = bi;
    }
}

// Phase 2: one warp reduces the partials and advances the state.
extern "C" __global__ void reflex_argmax_final(const float* part_v, const int* part_i, int n_part, RxState st, int last) {
    rx_pdl_begin();
    int lane = threadIdx.x;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = lane; i < n_part; i += 32)
        if (rx_better(part_v[i], part_i[i], bv, bi)) bv = part_v[i], bi = part_i[i];
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (rx_better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    if (lane == 0) rx_advance(st, last, bi == 0x7fffffff ? 0 : bi);
}

// ---- temperature / top-k / top-p / min-p ------------------------------------------------------

__device__ __forceinline__ unsigned rx_key(float f) {  // order-preserving float -> uint
    unsigned u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ unsigned long long rx_splitmix64(unsigned long long x) {
    x += 0x9E3779B97F4A7C15ull;
    unsigned long long z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__device__ double block_sum_d(double v, double* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    double t = lane < nw ? scratch[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    return t;
}

// z and p exactly as reference/sampling.py computes them: float32 division, float32 exp.
__device__ __forceinline__ float rx_z(const float* logits, int i, float temperature) { return logits[i] / temperature; }
__device__ __forceinline__ float rx_p(float z, float zmax) { return expf(z - zmax); }

__device__ unsigned block_count_ge(const float* logits, int n, float temperature, unsigned key, unsigned* scratch) {
    unsigned c = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) c += rx_key(rx_z(logits, i, temperature)) >= key;
    for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = c;
    __syncthreads();
    unsigned t = (threadIdx.x & 31) < (blockDim.x >> 5) ? scratch[threadIdx.x & 31] : 0;
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    return t;
}

// Mass (sum of p, in double) of tokens whose key is >= key.
__device__ double block_mass_ge(const float* logits, int n, float temperature, float zmax, unsigned key,
                                double* scratch) {
    double m = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float z = rx_z(logits, i, temperature);
        if (rx_key(z) >= key) m += (double)rx_p(z, zmax);
    }
    return block_sum_d(m, scratch);
}

// Sampling settings live in device memory so one captured decode graph serves every request.
struct RxSampling {
    float temperature;
    int top_k;
    float top_p;
    float min_p;
    unsigned long long seed;
};

// The sampled token of one row (one block of 1024 threads over the whole vocabulary); `step`
// (the request's token index) and the seed make the draw, so a request's tokens do not depend on
// what else ran beside it. Every thread returns the token.
__device__ int rx_sample_row(const float* logits, int n, const RxSampling* sp, int step) {
    float temperature = sp->temperature, top_p = sp->top_p, min_p = sp->min_p;
    int top_k = sp->top_k;
    unsigned long long seed = sp->seed;
    __shared__ double dscratch[32];
    __shared__ unsigned uscratch[32];
    __shared__ float fscratch[32];
    __shared__ double chunk_prefix[1024];
    __shared__ int chosen;
    float zl = -INFINITY;
    for (int i = threadIdx.x; i < n; i += blockDim.x) zl = fmaxf(zl, rx_z(logits, i, temperature));
    float zmax = block_max(zl, fscratch);
    unsigned thr = 0;  // keep key >= thr (and p >= min_p)
    if (top_k > 0 && top_k < n) {
        // Largest key with at least top_k tokens at or above it: the k-th largest value.
        unsigned lo = 0, hi = rx_key(zmax);
        while (lo < hi) {
            unsigned mid = (unsigned)(((unsigned long long)lo + hi + 1) >> 1);  // no overflow at hi = ~0u
            if (block_count_ge(logits, n, temperature, mid, uscratch) >= (unsigned)top_k) lo = mid;
            else hi = mid - 1;
        }
        thr = lo;
    }
    if (top_p < 1.0f) {
        double kept = block_mass_ge(logits, n, temperature, zmax, thr, dscratch);
        double need = (double)top_p * kept;
        unsigned lo = thr, hi = rx_key(zmax);
        while (lo < hi) {  // largest key whose mass at or above it still reaches top_p
            unsigned mid = (unsigned)(((unsigned long long)lo + hi + 1) >> 1);  // no overflow at hi = ~0u
            if (block_mass_ge(logits, n, temperature, zmax, mid, dscratch) >= need) lo = mid;
            else hi = mid - 1;
        }
        thr = lo;
    }
    // Draw in token-id order: each thread owns one contiguous chunk.
    int per = (n + blockDim.x - 1) / blockDim.x;
    int c0 = threadIdx.x * per, c1 = min(n, c0 + per);
    double mine = 0.0;
    for (int i = c0; i < c1; i++) {
        float z = rx_z(logits, i, temperature);
        float p = rx_p(z, zmax);
        if (rx_key(z) >= thr && p >= min_p) mine += (double)p;
    }
    chunk_prefix[threadIdx.x] = mine;
    if (threadIdx.x == 0) chosen = -1;
    __syncthreads();
    if (threadIdx.x == 0) {  // exclusive scan (1024 adds; cheap next to the passes above)
        double run = 0.0;
        for (int i = 0; i < (int)blockDim.x; i++) {
            double v = chunk_prefix[i];
            chunk_prefix[i] = run;
            run += v;
        }
        dscratch[0] = run;
    }
    __syncthreads();
    double total = dscratch[0];
    unsigned long long r = rx_splitmix64(rx_splitmix64(seed) ^ (unsigned long long)step);
    double target = (double)(r >> 40) * (1.0 / 16777216.0) * total;
    double run = chunk_prefix[threadIdx.x];
    if (mine > 0.0 && target >= run && target < run + mine) {
        for (int i = c0; i < c1; i++) {
            float z = rx_z(logits, i, temperature);
            float p = rx_p(z, zmax);
            if (rx_key(z) >= thr && p >= min_p) {
                run += (double)p;
                if (run > target) {
                    chosen = i;
                    break;
                }
            }
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int tok = chosen;
        if (tok < 0) {  // rounding put the target past the end: take the last kept token
            for (int i = n - 1; i >= 0; i--)
                if (rx_key(rx_z(logits, i, temperature)) >= thr && rx_p(rx_z(logits, i, temperature), zmax) >= min_p) {
                    tok = i;
                    break;
                }
        }
        chosen = tok < 0 ? 0 : tok;
    }
    __syncthreads();
    return chosen;
}

extern "C" __global__ void __launch_bounds__(1024) reflex_sample(const float* logits, int n, const RxSampling* sp,
                                                                 RxState st, int last) {
    rx_pdl_begin();
    int tok = rx_sample_row(logits, n, sp, *st.step);
    if (threadIdx.x == 0) rx_advance(st, last, tok);
}

// The argmax of one row by one block (lowest id on ties, NaN never wins); every thread returns it.
__device__ int rx_argmax_row(const float* x, int n) {
    __shared__ float sv[32];
    __shared__ int si[32];
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = x[i];
        if (v != v) v = -INFINITY;
        if (rx_better(v, i, bv, bi)) bv = v, bi = i;
    }
    rx_warp_argmax(bv, bi);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) sv[warp] = bv, si[warp] = bi;
    __syncthreads();
    bv = lane < (int)(blockDim.x >> 5) ? sv[lane] : -INFINITY;
    bi = lane < (int)(blockDim.x >> 5) ? si[lane] : 0x7fffffff;
    rx_warp_argmax(bv, bi);
    return bi == 0x7fffffff ? 0 : bi;
}

// A batch of sequences' decode state, one row each (continuous batching): the next input token,
// its position and cache slot, and the sequence's token count (its sampling step).
struct RxRows {
    int* tokens;
    int* pos;
    int* slot;
    int* steps;
};

// The pick of every row of a batch: grid (rows), 1024 threads. Row r's logits at logits + r * n,
// its settings sp[r] (greedy when temperature <= 0 or top_k == 1, as gpu/step.py Pick.greedy);
// then the row advances: tokens[r] = the pick, pos, slot and steps one further.
extern "C" __global__ void __launch_bounds__(1024) reflex_pick_rows(const float* logits, int n, const RxSampling* sp,
                                                                    RxRows st) {
    rx_pdl_begin();
    int r = blockIdx.x;
    const float* x = logits + (long)r * n;
    const RxSampling* p = sp + r;
    int step = st.steps[r];
    int tok = p->temperature <= 0.f || p->top_k == 1 ? rx_argmax_row(x, n) : rx_sample_row(x, n, p, step);
    if (threadIdx.x == 0) {
        st.tokens[r] = tok;
        st.pos[r] += 1;
        st.slot[r] += 1;
        st.steps[r] = step + 1;
    }
}
