// mma_ops.cuh: warp-wide tensor-core operations on registers, shared by the prompt kernels (through
// mma.cuh) and the decode attention's tensor-core kernels (attn_decode.cuh, which stage nothing in
// shared memory): mma.sync m16n8k16 (f16 inputs, f32 accumulate), an 8x8 transpose between lanes
// (movmatrix) and half2 packing.
//
// Every helper compiles to nothing below sm_80: the kernels that use them are never launched
// there, but their entries must exist in every architecture of the fatbin.
#pragma once

#include <cuda_fp16.h>
#include <stdint.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define RX_SM80 1
#else
#define RX_SM80 0
#endif

// c += a * b for one 16x8 tile: a = 16x16 (row major, 4 registers of 2 halves), b = 16x8
// (column major, 2 registers), c = 4 floats. Fragment layout (g = lane / 4, t = lane % 4):
// a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..], a[2] = A[g][2t+8..], a[3] = A[g+8][2t+8..];
// b[0] = B[2t..2t+1][g], b[1] = B[2t+8..2t+9][g]; c = C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1].
__device__ __forceinline__ void rx_mma(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
#if RX_SM80
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// The transpose of an 8x8 matrix of halves held one register a lane (lane l: row l / 4, columns
// 2 (l % 4) and + 1): lane l receives row l / 4 of the transpose, i.e. rows 2 (l % 4), + 1 of
// column l / 4. Turns rows loaded key-major into an mma operand paired along the keys.
__device__ __forceinline__ uint32_t rx_movt(uint32_t x) {
    uint32_t r = 0;
#if RX_SM80
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(r) : "r"(x));
#endif
    return r;
}

__device__ __forceinline__ uint32_t rx_pack_h2(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
}
