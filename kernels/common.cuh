// common.cuh: small helpers shared by every kernel file (reductions, half conversions,
// the per-type instantiation macro: dequant.cuh).
#pragma once

#include <cuda_fp16.h>
#include <stdint.h>

#include "dequant.cuh"  // dequant8<T>, RX_FOR_EACH_TYPE

#define RX_WARP 32

// Programmatic dependent launch (sm_90+). A kernel captured into the decode graph with the PDL
// attribute may be scheduled while its predecessor still runs, so its launch latency hides
// behind the predecessor's tail: every kernel calls this first, before any memory access.
// `wait` returns once the predecessor grid has finished and its writes are visible; only then
// do we let our own successor be scheduled, so at most one grid waits ahead. Launched without
// the attribute (or on older GPUs) both instructions are no-ops.
__device__ __forceinline__ void rx_pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The one exception to "rx_pdl_begin() first": a kernel whose first statement is this marker
// may copy *weights* (the GGUF data region, never written while a graph runs) and nothing else
// before it calls rx_pdl_begin(), so its weight loads overlap its predecessor (stage.cuh). Reads
// of anything a kernel writes must still come after rx_pdl_begin(), except where a kernel says
// why the writer finished two or more launches earlier (see reflex_attn_decode, moe_decode.cu).
__device__ __forceinline__ void rx_pdl_weights_first() {}

// Ask for the 128-byte line at p in L2 without waiting for it or holding a register: for rows a
// kernel will read after rx_pdl_begin() but that earlier launches wrote (reflex_attn_decode_t*).
__device__ __forceinline__ void rx_prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// The paged KV cache of serving (gpu/batch.py): a sequence's logical cache slot j lives in
// physical row blocks[j / RX_KV_BLOCK] * RX_KV_BLOCK + j % RX_KV_BLOCK of the pool; blocks NULL
// (one sequence: generate, check) is row j. Every kernel that reads or writes the caches maps
// slots through this, and nothing else: visibility, windows and kv_pos stay in logical slots.
#define RX_KV_BLOCK 16
__device__ __forceinline__ long rx_kv_row(const int* blocks, int j) {
    return blocks ? (long)blocks[j / RX_KV_BLOCK] * RX_KV_BLOCK + j % RX_KV_BLOCK : (long)j;
}

struct BlockSync {  // split_last's (and attention.cuh split_merge's) barrier for a whole block
    __device__ __forceinline__ void operator()() const { __syncthreads(); }
};

// Whether this block is the last of n to count itself done at *counter (its partials visible
// first); the block's threads agree through `flag` (shared).
template <typename Sync>
__device__ __forceinline__ bool split_last(int* counter, int n, int& flag, Sync sync) {
    __threadfence();
    sync();
    if (threadIdx.x == 0) flag = atomicAdd(counter, 1) == n - 1;
    sync();
    if (!flag) return false;
    __threadfence();
    return true;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block; every thread gets the result. `scratch` holds >= 32 floats.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < n_warps ? scratch[lane] : 0.0f;
    return warp_sum(t);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < n_warps ? scratch[lane] : -INFINITY;
    return warp_max(t);
}

// Activation functions of gated FFNs: 0 = SiLU (SwiGLU), 1 = GELU tanh approximation (GeGLU).
__device__ __forceinline__ float rx_act(float g, int act) {
    if (act == 0) return g / (1.0f + __expf(-g));
    const float c = 0.7978845608028654f;  // sqrt(2/pi)
    return 0.5f * g * (1.0f + tanhf(c * (g + 0.044715f * g * g * g)));
}
