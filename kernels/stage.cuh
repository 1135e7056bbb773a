// stage.cuh: copy a run of bytes from global into shared memory with 16-byte asynchronous copies
// (cp.async, sm_80+; plain 16-byte loads and stores before that), whatever the run's 2-byte
// alignment (GGUF blocks: Q8_0 is 34 bytes, Q6_K 210). The bytes land at the same address mod 16
// as in global memory, so the aligned interior moves in whole 16-byte chunks and only the < 16
// byte head and tail go 2 bytes at a time. A block issues every copy of its slice at once (many
// bytes in flight per SM), and a kernel may issue the copies of *weights* before it waits for its
// predecessor (rx_pdl_weights_first in common.cuh): the copies then overlap the previous kernel.
#pragma once

#include "common.cuh"

extern __shared__ __align__(16) uint8_t rx_dyn_smem[];

__device__ __forceinline__ void rx_cp16(void* smem_dst, const void* gsrc) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned d = (unsigned)__cvta_generic_to_shared(smem_dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(gsrc) : "memory");
#else
    *reinterpret_cast<uint4*>(smem_dst) = __ldg(reinterpret_cast<const uint4*>(gsrc));
#endif
}

// Close the group of copies issued so far (rx_cp_wait_prior<N> counts groups).
__device__ __forceinline__ void rx_cp_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// Wait until at most N of this thread's committed groups are still in flight. The copies are only
// visible to other threads after a __syncthreads() that follows this.
template <int N>
__device__ __forceinline__ void rx_cp_wait_prior() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

__device__ __forceinline__ void rx_cp_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

// Smem bytes rx_stage needs for a run of n bytes: its 16-byte chunks plus up to 30 bytes of
// alignment slack, rounded to 16 (the host's mvs_stage_bytes must say the same).
__host__ __device__ __forceinline__ long rx_stage_bytes(long n) { return (n + 30 + 15) & ~15L; }

// Block-wide: start copying bytes [src, src + n) (src and n even) into smem_base (16-aligned).
// Returns where src's first byte lands: smem_base + (src mod 16). Every thread of the block must
// call it with the same arguments (or, with t / nt, threads t = 0 .. nt - 1 of a part of it, nt
// >= 16); before reading the bytes: rx_cp_commit / rx_cp_wait_all (or rx_cp_wait_prior) and
// __syncthreads(). Reads exactly the bytes of the run, nothing around it.
__device__ __forceinline__ const uint8_t* rx_stage(uint8_t* smem_base, const uint8_t* src, long n, int t = -1,
                                                   int nt = 0) {
    uintptr_t a = reinterpret_cast<uintptr_t>(src), b = a + n;
    uintptr_t lo = a & ~(uintptr_t)15, a16 = (a + 15) & ~(uintptr_t)15, b16 = b & ~(uintptr_t)15;
    if (t < 0) t = threadIdx.x, nt = blockDim.x;
    if (a16 < b16) {
        for (uintptr_t p = a16 + 16 * (uintptr_t)t; p < b16; p += 16 * (uintptr_t)nt)
            rx_cp16(smem_base + (p - lo), reinterpret_cast<const void*>(p));
        // the head [a, a16) and the tail [b16, b): fewer than 8 halves each
        uintptr_t p = t < 8 ? a + 2 * t : b16 + 2 * (t - 8);
        if (t < 16 && p < (t < 8 ? a16 : b))
            *reinterpret_cast<uint16_t*>(smem_base + (p - lo)) = __ldg(reinterpret_cast<const unsigned short*>(p));
    } else {  // under 32 bytes with no whole aligned chunk inside
        for (uintptr_t p = a + 2 * (uintptr_t)t; p < b; p += 2 * (uintptr_t)nt)
            *reinterpret_cast<uint16_t*>(smem_base + (p - lo)) = __ldg(reinterpret_cast<const unsigned short*>(p));
    }
    return smem_base + (a - lo);
}

// rx_stage for a caller whose run sits inside a readable allocation with room around it (the
// model's arena: weights, then the rest): copies the whole 16-byte chunks that cover the run, all
// with cp.async, so no thread waits for a load here (rx_stage's 2-byte head and tail copies are
// plain loads, which stall their threads until the data arrives). Threads t = 0 .. nt - 1 of the
// block take part; the bytes land as rx_stage places them, within rx_stage_bytes(n).
__device__ __forceinline__ const uint8_t* rx_stage_hull(uint8_t* smem_base, const uint8_t* src, long n, int t,
                                                        int nt) {
    uintptr_t a = reinterpret_cast<uintptr_t>(src), lo = a & ~(uintptr_t)15, hi = (a + n + 15) & ~(uintptr_t)15;
    for (uintptr_t p = lo + 16 * (uintptr_t)t; p < hi; p += 16 * (uintptr_t)nt)
        rx_cp16(smem_base + (p - lo), reinterpret_cast<const void*>(p));
    return smem_base + (a - lo);
}
