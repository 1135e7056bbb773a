// kernels/delta_net.cu compiled for the host against tests/host_emu/common.cuh; one C entry point
// per kernel taking the launch shape first, then the kernel's own arguments (ctypes calls them).
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
            int n_seq, float* prep, int n_tok, int nk, int nv, int dk, int dv),
          P(qkv, alpha, beta, a, dt, seq, n_seq, prep, n_tok, nk, nv, dk, dv))
EMU_ENTRY(dn_chunked,
          P(const float* qkv, const float* alpha, const float* beta, const float* a, const float* dt, float* state,
            long stride, const int* slots, const int* seq, int n_seq, const int* pos, float* out, int n_tok, int nk,
            int nv, int dk, int dv, const float* prep),
          P(qkv, alpha, beta, a, dt, state, stride, slots, seq, n_seq, pos, out, n_tok, nk, nv, dk, dv, prep))
EMU_ENTRY(dn_gated_norm, P(const float* o, const float* z, const float* w, float* out, int rows, int dv, float eps),
          P(o, z, w, out, rows, dv, eps))
