// kernels/mla_flash.cu compiled for the host against tests/host_emu/common.cuh and mma.cuh; one C
// entry point taking the launch shape first, then the kernel's own arguments (ctypes calls it).
#define dim3 cuda_dim3  // the toolkit's own dim3 (vector_types.h) under another name: the stand-in has one
#include <cuda_fp16.h>
#undef dim3

#include "common.cuh"

#define __align__(n) alignas(n)
#define __trap() std::abort()

#include "mla_flash.cu"

extern "C" void emu_mla_flash(unsigned gx, unsigned gy, unsigned gz, unsigned threads, const float* q,
                              const half* cache, const int* q_slot, const int* seg_lo, int prefix_len,
                              const int* n_kv, float* out, int n_rows, int n_head, float scale, const int* blocks) {
    emu_launch(reflex_mla_flash, dim3{gx, gy, gz}, threads, q, cache, q_slot, seg_lo, prefix_len, n_kv, out, n_rows,
               n_head, scale, blocks);
}
