// The C entry points of kernels/attn_decode.cu's kernels (one per instantiation: the harness calls
// emu_ + the kernel's name less reflex_), the launch shape first; included after attn_decode.cu.
#pragma once

#define EMU_ATTN_DECODE(suffix)                                                                                   \
    extern "C" void emu_attn_decode##suffix(                                                                      \
        unsigned gx, unsigned gy, unsigned gz, unsigned threads, const float* q, half* k_cache, half* v_cache,    \
        int* kv_pos, const int* q_pos, const int* q_slot, const int* seq_lo, const int* n_kv_ptr, float* out,     \
        float* part_o, float* part_ml, int* counters, int n_head, int n_head_kv, int hd, int hd_v, int n_rows,    \
        int window, float scale, float softcap, int min_keys, int prefetch, int window_slots, AtdRope rope,       \
        int n_hg, int defer, int tc_min, const int* kv_blocks) {                                                  \
        emu_launch(reflex_attn_decode##suffix, dim3{gx, gy, gz}, threads, q, k_cache, v_cache, kv_pos, q_pos,     \
                   q_slot, seq_lo, n_kv_ptr, out, part_o, part_ml, counters, n_head, n_head_kv, hd, hd_v, n_rows, \
                   window, scale, softcap, min_keys, prefetch, window_slots, rope, n_hg, defer, tc_min, kv_blocks); \
    }
EMU_ATTN_DECODE()
EMU_ATTN_DECODE(_g2)
EMU_ATTN_DECODE(_g4)
EMU_ATTN_DECODE(_t2)
EMU_ATTN_DECODE(_t4)
EMU_ATTN_DECODE(_t8)
