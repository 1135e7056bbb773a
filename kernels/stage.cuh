// stage.cuh: 16-byte asynchronous copies from global into shared memory (cp.async, sm_80+; plain
// 16-byte loads and stores before that), and stage_run.cuh on them: a run of bytes whatever its 2-byte
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
