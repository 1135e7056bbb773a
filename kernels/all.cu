// all.cu: the one translation unit nvcc compiles into reflex.fatbin (see scripts/build_kernels.py).
// Every kernel is `extern "C"`, so the host resolves it by its plain name.
#include "embed.cu"
#include "norm.cu"
#include "matvec.cu"
#include "matmul.cu"
#include "rope.cu"
#include "attention.cu"
#include "attn_decode.cu"
#include "sample.cu"
#include "logits.cu"
#include "moe.cu"  // uses matvec.cu and matmul.cu bodies
#include "mvs.cu"  // uses matvec.cu's MvSegs
#include "moe_decode.cu"  // uses moe.cu and mvs.cu bodies
#include "moe_route.cu"  // uses moe.cu's moe_block_argmax
#include "mla.cu"  // uses matvec.cu, matmul.cu and attention.cu bodies
#include "gemm.cu"
#include "flash_attn.cu"
#include "delta_net.cu"
#include "gated.cu"
#include "constrain.cu"
