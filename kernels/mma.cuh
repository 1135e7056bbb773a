// mma.cuh: the sm_80+ building blocks the prompt kernels (gemm.cu, flash_attn.cu) share:
// asynchronous global->shared copies (cp.async), warp-wide tensor-core products (mma.sync
// m16n8k16, f16 inputs, f32 accumulate) and shared-memory fragment loads (ldmatrix).
//
// Every helper compiles to nothing below sm_80: the kernels that use them are never launched
// there (gpu/products.py keeps the WMMA and scalar kernels for older GPUs), but their entries
// must exist in every architecture of the fatbin.
#pragma once

#include <cuda_fp16.h>
#include <stdint.h>

#include "stage.cuh"  // rx_cp_commit, shared with the staged decode kernels

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define RX_SM80 1
#else
#define RX_SM80 0
#endif

// Copy 16 bytes global -> shared without going through registers; only the first src_bytes
// (0..16) are read, the rest of the 16 shared bytes are zero-filled. Both addresses 16-aligned.
__device__ __forceinline__ void rx_cp16(void* smem, const void* gmem, int src_bytes) {
#if RX_SM80
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
#endif
}

// The same with the shared address given as a 32-bit shared-space address (rx_saddr, found once:
// the generic -> shared conversion costs instructions per call): all 16 bytes when p holds (a
// predicated copy, no branch), or only src_bytes.
__device__ __forceinline__ uint32_t rx_saddr(const void* smem) {
#if RX_SM80
    return (uint32_t)__cvta_generic_to_shared(smem);
#else
    return 0;
#endif
}
__device__ __forceinline__ void rx_cp16s_if(uint32_t s, const void* gmem, bool p) {  // predicated: no branch
#if RX_SM80
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n @p cp.async.cg.shared.global [%0], [%1], 16;\n}\n"
                 ::"r"(s), "l"(gmem), "r"((int)p) : "memory");
#endif
}
__device__ __forceinline__ void rx_cp16s_part(uint32_t s, const void* gmem, int src_bytes) {
#if RX_SM80
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
#endif
}

// Wait until at most N of this thread's committed copy groups are still in flight.
template <int N>
__device__ __forceinline__ void rx_cp_wait() {
#if RX_SM80
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

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

// Four 8x8 half matrices from shared memory; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void rx_ldsm4(uint32_t* r, const void* smem) {
#if RX_SM80
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
#endif
}

// The same, each matrix transposed (for an operand stored k-major, such as V).
__device__ __forceinline__ void rx_ldsm4_t(uint32_t* r, const void* smem) {
#if RX_SM80
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
#endif
}

__device__ __forceinline__ uint32_t rx_pack_h2(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
}
