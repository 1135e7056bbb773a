// kernels/attn_decode.cu compiled for the host against tests/host_emu/common.cuh and stage.cuh; its C
// entry point takes the launch shape first, then the kernel's own arguments (ctypes calls it).
#define dim3 cuda_dim3  // the toolkit's own dim3 (vector_types.h) under another name: the stand-in has one
#include <cuda_fp16.h>
#include <vector_functions.h>
#undef dim3

#include "common.cuh"

#define __align__(n) __attribute__((aligned(n)))

#include "stage.cuh"
#include "attn_decode.cu"

extern "C" void emu_attn_decode(unsigned gx, unsigned gy, unsigned gz, unsigned threads, const float* q, half* k_cache,
                                half* v_cache, int* kv_pos, const int* q_pos, const int* q_slot, const int* seq_lo,
                                const int* n_kv_ptr, float* out, float* part_o, float* part_ml, int* counters,
                                int n_head, int n_head_kv, int hd, int hd_v, int n_rows, int window, float scale,
                                float softcap, int min_keys, int prefetch, int window_slots, AtdRope rope, int n_hg,
                                int defer, const int* kv_blocks) {
    emu_launch(reflex_attn_decode, dim3{gx, gy, gz}, threads, q, k_cache, v_cache, kv_pos, q_pos, q_slot, seq_lo,
               n_kv_ptr, out, part_o, part_ml, counters, n_head, n_head_kv, hd, hd_v, n_rows, window, scale, softcap,
               min_keys, prefetch, window_slots, rope, n_hg, defer, kv_blocks);
}
