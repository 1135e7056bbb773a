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

#include "attn_decode_entry.cuh"
