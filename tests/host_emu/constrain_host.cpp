// kernels/constrain.cu compiled for the host against tests/host_emu/common.cuh; one C entry point
// per kernel taking the launch shape first, then the kernel's own arguments (ctypes calls them).
#include "constrain.cu"

#define EMU_ENTRY(name, params, args)                                                       \
    extern "C" void emu_##name(unsigned gx, unsigned gy, unsigned gz, unsigned threads, params) { \
        emu_launch(reflex_##name, dim3{gx, gy, gz}, threads, args);                          \
    }
#define P(...) __VA_ARGS__

EMU_ENTRY(logit_stats, P(const float* x, int n, int k, float* part_f, int* part_i), P(x, n, k, part_f, part_i))
EMU_ENTRY(mask_logits, P(float* x, const unsigned* words, int n), P(x, words, n))
EMU_ENTRY(token_logit, P(const float* x, const int* tokens, float* out), P(x, tokens, out))
