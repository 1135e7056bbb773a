// state.cuh: the device-resident decode bookkeeping a step's last kernel advances (the sampler,
// the argmax, or the LM head with the argmax fused), so a captured decode step needs nothing
// from the host. Mirrored by gpu/driver.py RxState.
#pragma once

#include "common.cuh"

struct RxState {
    int* tokens;
    int* pos;
    int* slot;
    int* n_kv;
    int* step;
    int* out_tokens;
};

// After choosing `tok`: tokens[0] (the next step's input), out_tokens[step], and pos/slot/n_kv
// one past the last token of this pass (index `last`).
__device__ __forceinline__ void rx_advance(const RxState st, int last, int tok) {
    int step = *st.step;
    st.out_tokens[step] = tok;
    *st.step = step + 1;
    int p = st.pos[last] + 1, s = st.slot[last] + 1;
    st.tokens[0] = tok;
    st.pos[0] = p;
    st.slot[0] = s;
    *st.n_kv = s + 1;
}

// Argmax order: larger value first, the lower index on ties.
__device__ __forceinline__ bool rx_better(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

// Warp-wide argmax of (value, index) pairs; every lane gets the winner.
__device__ __forceinline__ void rx_warp_argmax(float& bv, int& bi) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (rx_better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
}
