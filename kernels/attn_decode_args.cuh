// attn_decode_args.cuh: attn_decode.cuh's inputs as plain C layouts, shared by reflex_attn_decode's
// parameters (AtdRope) and reflex_fused_step's program (fused_step.cuh FsAttn), mirrored by
// gpu/ops/attn_decode.py (tests/test_launch_abi.py compiles this header on the host and compares
// every offset with the mirror).
#pragma once

// The fused rope + cache store's inputs (kernels/rope.cu's, for one token); k == NULL: q is
// already rotated and the cache already holds the new key (a separate rope launch ran).
typedef struct {
    const float* k;        // raw key heads (n_head_kv x hd), this step's
    const float* v;        // raw value heads (n_head_kv x hd_v)
    const float* q_norm;   // per-head RMSNorm weights (hd) or NULL
    const float* k_norm;
    const float* factors;  // rope_dim / 2 frequency divisors or NULL
    float eps, base, freq_scale;
    int rope_dim, mode;    // mode 0: NeoX, 1: pairwise
    const double* theta;   // rope_dim / 2 angles per position, freq_scale * base^(-2i/rope_dim) (the host's)
} AtdRope;

// reflex_attn_decode's parameters as one value; the caches are f16 (void here: plain C).
typedef struct {
    const float* q;
    void* k_cache;
    void* v_cache;
    int* kv_pos;
    const int* q_pos;
    const int* q_slot;
    const int* seq_lo;
    const int* n_kv_ptr;
    float* out;
    float* part_o;
    float* part_ml;
    int* counters;
    int n_head, n_head_kv, hd, hd_v, n_rows, window;
    float scale, softcap;
    int min_keys, prefetch, window_slots;
    AtdRope rope;
    const int* kv_blocks;
} AtdArgs;
