// mma.cuh: the sm_80+ building blocks the prompt kernels (gemm.cu, flash_attn.cu) share:
// asynchronous global->shared copies (cp.async) and shared-memory fragment loads (ldmatrix), with
// mma_ops.cuh's warp-wide tensor-core products.
//
// Every helper compiles to nothing below sm_80: the kernels that use them are never launched
// there (gpu/products.py keeps the WMMA and scalar kernels for older GPUs), but their entries
// must exist in every architecture of the fatbin.
#pragma once

#include <cuda_fp16.h>
#include <stdint.h>

#include "mma_ops.cuh"  // RX_SM80, rx_mma, rx_pack_h2
#include "stage.cuh"  // rx_cp_commit, shared with the staged decode kernels

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
