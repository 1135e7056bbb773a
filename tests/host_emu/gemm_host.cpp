// kernels/gemm.cu compiled for the host against tests/host_emu/common.cuh and mma.cuh (the
// harness copies kernels/dequant.cuh, quant.cuh and mvs_decode.cuh beside them); one C entry
// point per kernel taking the launch shape first, then the kernel's own arguments (ctypes calls them).
#define dim3 cuda_dim3  // the toolkit's own dim3 (vector_types.h) under another name: the stand-in has one
#include <cuda_fp16.h>
#undef dim3

#include "common.cuh"
#include "dequant.cuh"

#define __align__(n) alignas(n)
#define __trap() std::abort()
inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
    uint64_t v = ((uint64_t)y << 32) | x;
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) r |= (uint32_t)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}
// kernels/common.cuh's activation (the stand-in leaves it out)
inline float rx_act(float g, int act) {
    if (act == 0) return g / (1.0f + __expf(-g));
    const float c = 0.7978845608028654f;
    return 0.5f * g * (1.0f + std::tanh(c * (g + 0.044715f * g * g * g)));
}

#include "gemm.cu"

#define P(...) __VA_ARGS__
#define EMU_ENTRY(name, params, args)                                                             \
    extern "C" void emu_##name(unsigned gx, unsigned gy, unsigned gz, unsigned threads, params) { \
        emu_launch(reflex_##name, dim3{gx, gy, gz}, threads, args);                               \
    }
#define EMU_GEMM(sfx, T)                                                                                        \
    EMU_ENTRY(gemm_##sfx##_l, P(GemmSegs s, long rb, const float* x, int xs, int K, int n, int acc),             \
              P(s, rb, x, xs, K, n, acc))                                                                       \
    EMU_ENTRY(gemm_##sfx##_s, P(GemmSegs s, long rb, const float* x, int xs, int K, int n, int acc),             \
              P(s, rb, x, xs, K, n, acc))                                                                       \
    EMU_ENTRY(gemm_glu_##sfx##_l,                                                                               \
              P(const uint8_t* wg, const uint8_t* wu, long rb, const float* x, int xs, float* o, int nf, int K,  \
                int n, int act),                                                                                \
              P(wg, wu, rb, x, xs, o, nf, K, n, act))                                                           \
    EMU_ENTRY(gemm_glu_##sfx##_s,                                                                               \
              P(const uint8_t* wg, const uint8_t* wu, long rb, const float* x, int xs, float* o, int nf, int K,  \
                int n, int act),                                                                                \
              P(wg, wu, rb, x, xs, o, nf, K, n, act))                                                           \
    EMU_MOE(sfx, ) EMU_MOE(sfx, _n)
#define EMU_MOE(sfx, cfg)                                                                                       \
    EMU_ENTRY(moe_gemm_glu_##sfx##cfg,                                                                          \
              P(const uint8_t* wg, const uint8_t* wu, long rb, long eb, const int* cnt, const int* off,          \
                const int* te, const int* tm, const int* nt, const int* pt, const __half* x, int xs, __half* o, \
                int nf, int K, int act),                                                                        \
              P(wg, wu, rb, eb, cnt, off, te, tm, nt, pt, x, xs, o, nf, K, act))                                \
    EMU_ENTRY(moe_gemm_down_##sfx##cfg,                                                                         \
              P(const uint8_t* wd, long rb, long eb, const int* cnt, const int* off, const int* te,             \
                const int* tm, const int* nt, const int* pid, const __half* act, int K, const float* wts, int k,\
                float* yb, float* x, int ne, int* ctr),                                                         \
              P(wd, rb, eb, cnt, off, te, tm, nt, pid, act, K, wts, k, yb, x, ne, ctr))

RX_FOR_EACH_TYPE(EMU_GEMM)
EMU_ENTRY(gemm_to_half, P(const float* x, __half* y, long n), P(x, y, n))
