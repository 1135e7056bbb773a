// kernels/delta_net.cu compiled for the host against tests/host_emu/common.cuh; one C entry point
// per kernel taking the launch shape first, then the kernel's own arguments (ctypes calls them).
#include <cstring>

struct alignas(16) float4 {  // the device's vector type, for the chunked kernel's 16-byte shared loads
    float x, y, z, w;
};
#define __align__(n) alignas(n)
alignas(16) static unsigned char emu_dyn_smem[64 * 1024];  // the chunked kernel's dynamic shared memory

#include "delta_net.cu"

#define EMU_ENTRY(name, params, args)                                                       \
    extern "C" void emu_##name(unsigned gx, unsigned gy, unsigned gz, unsigned threads, params) { \
        emu_launch(reflex_##name, dim3{gx, gy, gz}, threads, args);                          \
    }
#define P(...) __VA_ARGS__

EMU_ENTRY(dn_conv,
          P(const float* x, const float* w, float* state, long stride, const int* slots, const int* seq, int n_seq,
            const int* pos, float* out, int n_tok, int K, int nk, int nv, int dk, int dv, float q_scale, float eps,
            int roll),
          P(x, w, state, stride, slots, seq, n_seq, pos, out, n_tok, K, nk, nv, dk, dv, q_scale, eps, roll))
EMU_ENTRY(dn_conv_state,
          P(const float* x, float* state, long stride, const int* slots, const int* seq, int n_seq, const int* pos,
            int n_tok, int C, int K),
          P(x, state, stride, slots, seq, n_seq, pos, n_tok, C, K))
EMU_ENTRY(dn_recurrent,
          P(const float* qkv, const float* alpha, const float* beta, const float* z, const float* a, const float* dt,
            const float* norm_w, float* state, long stride, const int* slots, const int* seq, int n_seq,
            const int* pos, float* out, int n_tok, int nk, int nv, int dk, int dv, float eps),
          P(qkv, alpha, beta, z, a, dt, norm_w, state, stride, slots, seq, n_seq, pos, out, n_tok, nk, nv, dk, dv, eps))
EMU_ENTRY(dn_prep,
          P(const float* qkv, const float* alpha, const float* beta, const float* a, const float* dt, const int* seq,
            int s_base, float* prep, int n_tok, int nk, int nv, int dk, int dv),
          P(qkv, alpha, beta, a, dt, seq, s_base, prep, n_tok, nk, nv, dk, dv))
EMU_ENTRY(dn_chunked,
          P(float const* qkv, float* state, long stride, const int* slots, const int* seq, int s_base, const int* pos,
            float* out, int n_tok, int nk, int nv, int dk, int dv, const float* prep),
          P(qkv, state, stride, slots, seq, s_base, pos, out, n_tok, nk, nv, dk, dv, prep))
EMU_ENTRY(dn_gated_norm, P(const float* o, const float* z, const float* w, float* out, int rows, int dv, float eps),
          P(o, z, w, out, rows, dv, eps))
