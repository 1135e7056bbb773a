// mvs_decode.cuh: the fast decoders of the staged matrix-vector kernels (mvs.cu): the dot product
// of one 32-weight unit of a row (a Q8_0 block, a Q4_K sub-block, a quarter of a Q6_K half
// super-block) with the 32 inputs a lane holds, as integers: the inputs as int16 with one scale
// per unit (MvsQ, made once per kernel) times the weights' integer codes by dp2a (mvs_idot_*).
// Weights come from shared memory as aligned 32-bit words (rows are only 2-byte aligned: a funnel
// shift realigns them). Also the float decoders of 8 weights every other kernel uses (bytes
// become floats by a byte permute into the mantissa of 2^23 and one subtraction).
// Host-compilable like quant.cuh: tests/test_quant_decode.py builds it with gcc and compares it
// with gguf-py on rows that start 2 bytes off a 4-byte boundary.
#pragma once

#include <math.h>
#include <string.h>

#ifdef __CUDACC__
#include <cuda_fp16.h>
#endif

#include "quant.cuh"

RX_HD uint32_t mvs_ld32(const uint8_t* p) {  // p 4-byte aligned
#ifdef __CUDA_ARCH__
    return *reinterpret_cast<const uint32_t*>(p);
#else
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
#endif
}

// __byte_perm(x, y, s): byte n of the result is byte (s >> 4n) & 7 of the 8 bytes y:x.
RX_HD uint32_t mvs_perm(uint32_t x, uint32_t y, uint32_t s) {
#ifdef __CUDA_ARCH__
    return __byte_perm(x, y, s);
#else
    uint64_t v = ((uint64_t)y << 32) | x;
    uint32_t r = 0;
    for (int n = 0; n < 4; n++) r |= (uint32_t)((v >> (8 * ((s >> (4 * n)) & 7))) & 0xFFu) << (8 * n);
    return r;
#endif
}

// The 32 bits of hi:lo starting at bit sh (0 or 16 here).
RX_HD uint32_t mvs_funnel(uint32_t lo, uint32_t hi, unsigned sh) {
#ifdef __CUDA_ARCH__
    return __funnelshift_r(lo, hi, sh);
#else
    return (uint32_t)(((((uint64_t)hi) << 32) | lo) >> (sh & 31));
#endif
}

RX_HD float mvs_h2f(uint32_t h) {
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half((unsigned short)h));
#else
    return rx_f16(h & 0xFFFFu);
#endif
}

// Byte i of v (0..255) as a float, minus `off`, exactly: 2^23 + byte is the float with the byte
// as its low mantissa bits.
RX_HD float mvs_byte(uint32_t v, int i, float off) {
    return rx_bits_to_f32(mvs_perm(v, 0x4B000000u, 0x7440u + i)) - off;
}

// -- Integer dots: a lane's 32 inputs as int16 (x ~ d * q, one scale per 32), products with the
// weights' integer codes summed by dp2a (two int16 x two 8-bit codes + an int32, one instruction),
// then one float multiply per unit. Per Q8_0 block that is 16 integer dot instructions where the
// float path spends 32 byte-to-float conversions and 32 FMAs: the decode GEMVs were bound by
// instructions, not bytes. int16 keeps x to ~1.5e-5 of the unit's largest |x| (int8, as
// llama.cpp's q8_1, would be ~4e-3). No overflow: 32 * 32767 * 128 < 2^31.

// The lane's inputs: q[m] holds inputs 2m (low half) and 2m + 1 (high half) of the unit.
typedef struct {
    uint32_t q[16];
    float d;     // x ~ d * q; NaN when an input is NaN or infinite, so the dot is not finite either
    float sum;   // sum of the float inputs (Q4_K's minimums)
    int s16[2];  // sums of q over inputs 0..15 and 16..31 (Q6_K's codes are offset by 32)
} MvsQ;

// round(v) for |v| < 2^22 sits in the low mantissa bits of v + 1.5 * 2^23, as 0x4B400000 + round(v):
// one FMA rounds x * id to an integer (to nearest, once), with no float-to-int conversion (F2I
// issues at an eighth of the FMA rate on sm_90), and its low 16 bits are already round(v)'s int16.
#define MVS_MAGIC 12582912.f
#define MVS_MAGIC_BITS 0x4B400000

RX_HD uint32_t mvs_f2bits(float v) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(v);
#else
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
#endif
}

// x[0..32) -> MvsQ; `sum` is the caller's sum of the 32 floats.
RX_HD void mvs_quant32(const float* x, float sum, MvsQ* out) {
    float m4[4] = {0.f, 0.f, 0.f, 0.f};  // four independent chains, not one of 32 dependent maxima
    for (int i = 0; i < 32; i++) m4[i & 3] = fmaxf(m4[i & 3], fabsf(x[i]));
    float amax = fmaxf(fmaxf(m4[0], m4[1]), fmaxf(m4[2], m4[3]));
    float id = amax > 1e-30f ? 32767.f / amax : 0.f;  // (below that, x's part of the dot is < 1e-30 |w|)
    int s0 = 0, s1 = 0;
    for (int m = 0; m < 16; m++) {
        uint32_t a = mvs_f2bits(fmaf(x[2 * m], id, MVS_MAGIC)), b = mvs_f2bits(fmaf(x[2 * m + 1], id, MVS_MAGIC));
        out->q[m] = mvs_perm(a, b, 0x5410u);  // low halves: round(x[2m]) | round(x[2m + 1]) << 16
        int ab = (int)(a - MVS_MAGIC_BITS) + (int)(b - MVS_MAGIC_BITS);
        if (m < 8) s0 += ab;
        else s1 += ab;
    }
    out->d = amax * (1.f / 32767.f) + 0.f * sum;  // 0 * (inf or NaN) = NaN: a non-finite input shows
    out->sum = sum;
    out->s16[0] = s0, out->s16[1] = s1;
}

// c + the two int16 of a times bytes 0, 1 (lo) or 2, 3 (hi) of b, as signed (s8) or unsigned (u8) bytes.
#ifdef __CUDA_ARCH__
#define RX_DP2A(name, mode, btype)                                               \
    __device__ __forceinline__ int name(uint32_t a, uint32_t b, int c) {         \
        int d;                                                                   \
        asm("dp2a." mode ".s32." btype " %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c)); \
        return d;                                                                \
    }
#else
#define RX_DP2A(name, mode, btype)                                                                          \
    static inline int name(uint32_t a, uint32_t b, int c) {                                                 \
        int hi = mode[0] == 'h', sb = btype[0] == 's';                                                      \
        int b0 = (b >> (16 * hi)) & 0xFF, b1 = (b >> (16 * hi + 8)) & 0xFF;                                 \
        if (sb) b0 = (int8_t)b0, b1 = (int8_t)b1;                                                           \
        return c + (int)(int16_t)(a & 0xFFFFu) * b0 + (int)(int16_t)(a >> 16) * b1;                         \
    }
#endif
RX_DP2A(mvs_dp2a_lo_s8, "lo", "s32")
RX_DP2A(mvs_dp2a_hi_s8, "hi", "s32")
RX_DP2A(mvs_dp2a_lo_u8, "lo", "u32")
RX_DP2A(mvs_dp2a_hi_u8, "hi", "u32")

// Words 0..8 covering the 32 bytes at p (p even) and the shift that realigns them: word k of
// the run is mvs_funnel(w[k], w[k + 1], sh). Reads up to 4 bytes past the run.
RX_HD unsigned mvs_words9(const uint8_t* p, uint32_t* w) {
    unsigned odd = (unsigned)((uintptr_t)p & 2);  // pointer arithmetic keeps device loads in shared space
    const uint8_t* a = p - odd;
    for (int k = 0; k < 9; k++) w[k] = mvs_ld32(a + 4 * k);
    return odd * 8;
}

// Sub-block sub's 6-bit scale and min in the Q4_K super-block at b (4-byte aligned), from the 12
// scale bytes read as three words (quant.cuh's rx_k4_scale_min reads them byte by byte).
RX_HD void mvs_q4k_scale_min(const uint8_t* b, int sub, uint32_t* sc, uint32_t* mn) {
    int shb = 8 * (sub & 3);
    uint32_t a0 = (mvs_ld32(b + 4) >> shb) & 0xFFu, a1 = (mvs_ld32(b + 8) >> shb) & 0xFFu;
    uint32_t a2 = (mvs_ld32(b + 12) >> shb) & 0xFFu;
    *sc = sub < 4 ? (a0 & 63u) : ((a2 & 15u) | ((a0 >> 6) << 4));
    *mn = sub < 4 ? (a1 & 63u) : ((a2 >> 4) | ((a1 >> 6) << 4));
}

// Q8_0 block `blk` times the lane's inputs, integer form: d * x->d * sum(q_w q_x).
RX_HD float mvs_idot_q8_0(const uint8_t* row, const MvsQ* x, int blk) {
    const uint8_t* b = row + 34 * blk;
    uint32_t w[9];
    unsigned sh = mvs_words9(b + 2, w);
    int acc0 = 0, acc1 = 0;
    for (int k = 0; k < 8; k++) {
        uint32_t v = mvs_funnel(w[k], w[k + 1], sh);  // weights 4k .. 4k + 3
        acc0 = mvs_dp2a_lo_s8(x->q[2 * k], v, acc0);
        acc1 = mvs_dp2a_hi_s8(x->q[2 * k + 1], v, acc1);
    }
    return mvs_h2f(rx_u16(b)) * (x->d * (float)(acc0 + acc1));  // x's scale first: no subnormal scale product
}

// Q4_K sub-block u, integer form: d * sc * x->d * sum(q x_q) - dmin * mn * sum(x).
RX_HD float mvs_idot_q4_k(const uint8_t* row, const MvsQ* x, int u) {
    const uint8_t* b = row + 144 * (u >> 3);
    int sub = u & 7, nsh = 4 * (sub & 1);
    uint32_t dd = mvs_ld32(b);
    uint32_t sc, mn;
    mvs_q4k_scale_min(b, sub, &sc, &mn);
    const uint8_t* q = b + 16 + 32 * (sub >> 1);
    int acc0 = 0, acc1 = 0;
    for (int k = 0; k < 8; k++) {
        uint32_t v = (mvs_ld32(q + 4 * k) >> nsh) & 0x0F0F0F0Fu;
        acc0 = mvs_dp2a_lo_u8(x->q[2 * k], v, acc0);
        acc1 = mvs_dp2a_hi_u8(x->q[2 * k + 1], v, acc1);
    }
    return mvs_h2f(dd) * (float)sc * (x->d * (float)(acc0 + acc1)) - mvs_h2f(dd >> 16) * (float)mn * x->sum;
}

// Q6_K unit u, integer form: the codes 0..63 against x_q, minus 32 * sum(x_q) per 16-weight half.
RX_HD float mvs_idot_q6_k(const uint8_t* row, const MvsQ* x, int u) {
    const uint8_t* b = row + 210 * (u >> 3);
    int hf = (u >> 2) & 1, r = u & 3, nib = 4 * (r >> 1), hs = 2 * r;
    uint32_t lw[9], hw[9];
    unsigned sh = mvs_words9(b + 64 * hf + 32 * (r & 1), lw);
    mvs_words9(b + 128 + 32 * hf, hw);
    uint32_t scw = rx_u16(b + 192 + 8 * hf + 2 * r);
    int acc[2] = {0, 0};
    for (int k = 0; k < 8; k++) {
        uint32_t lo = mvs_funnel(lw[k], lw[k + 1], sh), hi = mvs_funnel(hw[k], hw[k + 1], sh);
        uint32_t v = ((lo >> nib) & 0x0F0F0F0Fu) | (((hi >> hs) & 0x03030303u) << 4);
        acc[k >> 2] = mvs_dp2a_lo_u8(x->q[2 * k], v, acc[k >> 2]);
        acc[k >> 2] = mvs_dp2a_hi_u8(x->q[2 * k + 1], v, acc[k >> 2]);
    }
    return mvs_h2f(rx_u16(b + 208)) * (x->d * ((float)(int8_t)(scw & 0xFFu) * (float)(acc[0] - 32 * x->s16[0]) +
                                               (float)(int8_t)((scw >> 8) & 0xFFu) * (float)(acc[1] - 32 * x->s16[1])));
}

// -- 8 weights as floats: the same values as quant.cuh's dequant8_q8_0 / _q4_k / _q6_k, bit for
// bit, with bytes becoming floats through the mantissa of 2^23 (mvs_byte) instead of int-to-float
// conversions (a quarter of the FMA rate or less), and 32-bit loads where the blocks allow; they
// read only their blocks' bytes. common.cuh's dequant8 uses them for every kernel.

// Q8_0 weights 8g .. 8g + 7 (rows 2-byte aligned; reads only the block's bytes).
RX_HD void dequant8_fast_q8_0(const uint8_t* row, int g, float* out) {
    const uint8_t* b = row + 34 * (g >> 2);
    float d = mvs_h2f(rx_u16(b));
    uint64_t q = rx_ld8_a2(b + 2 + 8 * (g & 3)) ^ 0x8080808080808080ull;  // signed -> offset by 128
    uint32_t v[2] = {(uint32_t)q, (uint32_t)(q >> 32)};
    for (int i = 0; i < 8; i++) out[i] = d * mvs_byte(v[i >> 2], i & 3, 8388736.f);
}

// Q4_K weights 8g .. 8g + 7 (super-blocks 16-byte aligned, as every kernel reads them).
RX_HD void dequant8_fast_q4_k(const uint8_t* row, int g, float* out) {
    const uint8_t* b = row + 144 * (g >> 5);
    int e = 8 * (g & 31), sub = e >> 5, nsh = 4 * (sub & 1);
    uint32_t dd = mvs_ld32(b);
    uint32_t sc, mn;
    mvs_q4k_scale_min(b, sub, &sc, &mn);
    float d = mvs_h2f(dd & 0xFFFFu) * (float)sc, m = mvs_h2f(dd >> 16) * (float)mn;
    const uint8_t* q = b + 16 + 32 * (sub >> 1) + (e & 31);
    uint32_t v[2] = {(mvs_ld32(q) >> nsh) & 0x0F0F0F0Fu, (mvs_ld32(q + 4) >> nsh) & 0x0F0F0F0Fu};
    for (int i = 0; i < 8; i++) out[i] = d * mvs_byte(v[i >> 2], i & 3, 8388608.f) - m;
}

// Q6_K weights 8g .. 8g + 7 (rows 2-byte aligned; reads only the block's bytes).
RX_HD void dequant8_fast_q6_k(const uint8_t* row, int g, float* out) {
    const uint8_t* b = row + 210 * (g >> 5);
    int e = 8 * (g & 31);
    int half = e >> 7, r = (e >> 5) & 3, l0 = e & 31, nib = (r >> 1) * 4, hs = 2 * r;
    uint64_t ql = rx_ld8_a2(b + 64 * half + 32 * (r & 1) + l0), qh = rx_ld8_a2(b + 128 + 32 * half + l0);
    float sc = mvs_h2f(rx_u16(b + 208)) * (float)(int8_t)b[192 + 8 * half + (l0 >> 4) + 2 * r];
    for (int k = 0; k < 2; k++) {
        uint32_t l = (uint32_t)(ql >> (32 * k)), h = (uint32_t)(qh >> (32 * k));
        uint32_t v = ((l >> nib) & 0x0F0F0F0Fu) | (((h >> hs) & 0x03030303u) << 4);
        for (int i = 0; i < 4; i++) out[4 * k + i] = sc * mvs_byte(v, i, 8388640.f);  // q - 32
    }
}
