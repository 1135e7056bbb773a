// kernels/rope.cu compiled for the host against tests/host_emu/common.cuh; one C entry point taking
// the launch shape first, then the kernel's own arguments (ctypes calls it).
#define dim3 cuda_dim3  // the toolkit's own dim3 (vector_types.h) under another name: the stand-in has one
#include <cuda_fp16.h>
#undef dim3

#include "common.cuh"
#include "rope.cu"

extern "C" void emu_qk_rope_store(unsigned gx, unsigned gy, unsigned gz, unsigned threads, float* q, const float* k,
                                  const float* v, const float* q_norm, const float* k_norm, const int* pos,
                                  const int* slot, int* kv_pos, half* k_cache, half* v_cache, int n_head,
                                  int n_head_kv, int hd, int hd_v, int rope_dim, float base, float freq_scale,
                                  const float* freq_factors, int pairwise, float eps, int n_rows,
                                  int heads_per_block, const int* kv_blocks) {
    emu_launch(reflex_qk_rope_store, dim3{gx, gy, gz}, threads, q, k, v, q_norm, k_norm, pos, slot, kv_pos, k_cache,
               v_cache, n_head, n_head_kv, hd, hd_v, rope_dim, base, freq_scale, freq_factors, pairwise, eps, n_rows,
               heads_per_block, kv_blocks);
}
