// norm.cu: RMSNorm with the residual add fused in, one row per block.
//
//   resid == NULL:                out = norm(src) * w_out
//   resid != NULL, w_src == NULL: resid += src;                 out = norm(resid) * w_out
//   resid != NULL, w_src != NULL: resid += norm(src) * w_src;   out = norm(resid) * w_out
// The third form is Gemma's post-norm followed by the next pre-norm. `out` may be NULL (only
// the residual update). norm(v) = v / sqrt(mean(v^2) + eps). Bound by 3-4 reads of the row.
#include "norm.cuh"

extern "C" __global__ void __launch_bounds__(1024) reflex_rmsnorm(const float* src, const float* w_src, float* resid,
                                                                  const float* w_out, float* out, int n, float eps) {
    rx_pdl_begin();
    __shared__ float scratch[32];
    long off = (long)blockIdx.x * n;
    rx_rmsnorm_row(src + off, w_src, resid ? resid + off : nullptr, w_out, out ? out + off : nullptr, n, eps, scratch);
}

// Elementwise y = act(gate) * up for gated FFNs whose gate and up weights differ in type.
extern "C" __global__ void reflex_glu(const float* gate, const float* up, float* y, long n, int act) {
    rx_pdl_begin();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = rx_act(gate[i], act) * up[i];
}

// Elementwise y = x * scale (Gemma's embedding scale, logit scaling).
extern "C" __global__ void reflex_scale(float* y, long n, float scale) {
    rx_pdl_begin();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] *= scale;
}
