// fused_step.cuh: the program reflex_fused_step (fused_step.cu) runs, one op per phase of a decode
// step. Plain C layouts, mirrored by gpu/ops/fused_step.py (tests/test_fused_step.py compiles
// this header on the host and compares every offset with the ctypes mirror).
#pragma once

#include <stdint.h>

#include "attn_decode_args.cuh"


#define FS_EMBED 0  // x = scale * embedding row of tokens[0]
#define FS_MV 1     // y_s (+)= W_s x' for up to three matrices sharing x (q, k, v)
#define FS_GLU 2    // y = act(Wg x') * (Wu x')
#define FS_ATTN 3   // attention of the step's token (attn_decode.cuh, the rope and cache store fused)
#define FS_NORM 4   // norm.cuh's rx_rmsnorm_row (Gemma's post-norm, residual add and next pre-norm)
#define FS_HEAD 5   // logits = W x', the greedy pick fused when pick.part_v is set; the last op

// mvs.cuh's MvsPick with state.cuh's RxState spelled out (six int pointers)
typedef struct {
    float* part_v;
    int* part_i;
    int* counter;
    int* st[6];  // tokens, pos, slot, n_kv, step, out_tokens
    int last;
} FsPick;

// Matrix ops: tile t of the op is rows [t * rb, t * rb + rb) of one matrix (the matrices' tiles
// in order; FS_GLU: of gate and up together). x' = x, RMS-normalized with norm_w when set.
// post_src set (a post-norm folded in, gpu/fused.py): x' = norm(r) * norm_w instead, with
// r = post_resid + norm(post_src) * post_w_src, which block 0 also stores to post_resid_out.
typedef struct {
    const uint8_t* w[3];
    float* y[3];
    long row_bytes[3];
    int rows[3];
    int type[3];  // RX_* of quant.cuh
    int n_w;
    int K, rb, wpr, accumulate, act;
    const float* x;
    const float* norm_w;
    float eps;
    FsPick pick;
    const float* post_src;
    const float* post_w_src;
    const float* post_resid;
    float* post_resid_out;
} FsMv;

typedef struct {
    const float* src;
    const float* w_src;
    float* resid;
    const float* w_out;
    float* out;
    int n;
    float eps;
} FsNorm;

typedef struct {
    const uint8_t* table;
    long row_bytes;
    const int* tokens;
    float* out;
    int n_embd, n_vocab, type;
    float scale;
} FsEmbed;

typedef struct {
    AtdArgs a;      // attn_decode.cuh's inputs
    int max_split;  // slices per KV head: work items n_head_kv * max_split over the grid
    int n_hg;       // blocks that may share a KV head's query heads at short contexts (atd_body's n_hg)
} FsAttn;

typedef struct {
    int kind;
    union {
        FsMv mv;
        FsAttn attn;
        FsNorm norm;
        FsEmbed embed;
    } u;
} FsOp;
