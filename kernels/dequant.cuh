// dequant.cuh: dequant8<T>, the 8-weight decoder of a compile-time weight type, and
// RX_FOR_EACH_TYPE. Apart from common.cuh so that tests/host_emu can compile the prompt kernels
// with g++ against its own stand-in for the rest (quant.cuh and mvs_decode.cuh compile on the host).
#pragma once

#include "mvs_decode.cuh"  // dequant8_fast_*
#include "quant.cuh"

// Decode 8 weights of group g of a row, for a compile-time type.
template <int T>
__device__ __forceinline__ void dequant8(const uint8_t* row, int g, float* w) {
    if (T == RX_F32) dequant8_f32(row, g, w);
    else if (T == RX_F16) dequant8_f16(row, g, w);
    else if (T == RX_BF16) dequant8_bf16(row, g, w);
    else if (T == RX_Q8_0) dequant8_fast_q8_0(row, g, w);  // mvs_decode.cuh: no int-to-float conversions
    else if (T == RX_Q4_0) dequant8_q4_0(row, g, w);
    else if (T == RX_Q5_0) dequant8_q5_0(row, g, w);
    else if (T == RX_Q4_1) dequant8_q4_1(row, g, w);
    else if (T == RX_Q5_1) dequant8_q5_1(row, g, w);
    else if (T == RX_Q4_K) dequant8_fast_q4_k(row, g, w);
    else if (T == RX_Q5_K) dequant8_q5_k(row, g, w);
    else if (T == RX_Q6_K) dequant8_fast_q6_k(row, g, w);
}

// Instantiate `MACRO(suffix, type_id)` for every weight type the kernels read.
#define RX_FOR_EACH_TYPE(MACRO) \
    MACRO(f32, RX_F32)          \
    MACRO(f16, RX_F16)          \
    MACRO(bf16, RX_BF16)        \
    MACRO(q8_0, RX_Q8_0)        \
    MACRO(q4_0, RX_Q4_0)        \
    MACRO(q5_0, RX_Q5_0)        \
    MACRO(q4_1, RX_Q4_1)        \
    MACRO(q5_1, RX_Q5_1)        \
    MACRO(q4_k, RX_Q4_K)        \
    MACRO(q5_k, RX_Q5_K)        \
    MACRO(q6_k, RX_Q6_K)
