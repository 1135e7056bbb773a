// quant.cuh: decode GGUF weight blocks, 8 consecutive weights at a time.
//
// One function per ggml type: dequant8_<type>(row, g, out) writes the weights 8g .. 8g+7 of a
// row whose blocks start at `row`. Eight is the unit every kernel works in: a warp covers 256
// weights per step, which is one K-quant super-block or eight 32-weight blocks.
//
// Everything here is __host__ __device__ and reads bytes through the helpers below (GGUF
// blocks are only 2-byte aligned: Q8_0 is 34 bytes, Q6_K 210), so tests compile this file
// with g++ and check it against gguf-py's dequantizers on random blocks.
#pragma once

#include <stdint.h>

#ifdef __CUDACC__
#define RX_HD __host__ __device__ __forceinline__
#else
#define RX_HD static inline
#endif

// ggml type ids (gguf.constants.GGMLQuantizationType)
enum {
    RX_F32 = 0, RX_F16 = 1, RX_Q4_0 = 2, RX_Q4_1 = 3, RX_Q5_0 = 6, RX_Q5_1 = 7, RX_Q8_0 = 8,
    RX_Q4_K = 12, RX_Q5_K = 13, RX_Q6_K = 14, RX_BF16 = 30,
};

// Loads. Every 16-bit field in these blocks sits at an even offset, and rows start at least
// 16-byte aligned on the device (checked on the host), so the device reads whole 16/32/64-bit
// words; the host copy reads bytes, which is what the CPU tests exercise for layout.
RX_HD uint32_t rx_u16(const uint8_t* p) {
#ifdef __CUDA_ARCH__
    return *reinterpret_cast<const uint16_t*>(p);
#else
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8);
#endif
}
RX_HD uint32_t rx_u32(const uint8_t* p) { return rx_u16(p) | (rx_u16(p + 2) << 16); }

// 4 bytes at a 4-byte aligned address (Q4_1 and Q5_1 blocks are 20 and 24 bytes long).
RX_HD uint32_t rx_u32_a4(const uint8_t* p) {
#ifdef __CUDA_ARCH__
    return *reinterpret_cast<const uint32_t*>(p);
#else
    return rx_u32(p);
#endif
}

// 8 bytes at an even address (little-endian), as one 64-bit value.
RX_HD uint64_t rx_ld8_a2(const uint8_t* p) {
#ifdef __CUDA_ARCH__
    const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
    return (uint64_t)h[0] | ((uint64_t)h[1] << 16) | ((uint64_t)h[2] << 32) | ((uint64_t)h[3] << 48);
#else
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
#endif
}

// 8 bytes at a 4-byte aligned address.
RX_HD uint64_t rx_ld8_a4(const uint8_t* p) {
#ifdef __CUDA_ARCH__
    const uint32_t* w = reinterpret_cast<const uint32_t*>(p);
    return (uint64_t)w[0] | ((uint64_t)w[1] << 32);
#else
    return rx_ld8_a2(p);
#endif
}

// 8 bytes at an 8-byte aligned address.
RX_HD uint64_t rx_ld8_a8(const uint8_t* p) {
#ifdef __CUDA_ARCH__
    return *reinterpret_cast<const uint64_t*>(p);
#else
    return rx_ld8_a2(p);
#endif
}

#define RX_BYTE(v, i) ((uint32_t)((v) >> (8 * (i))) & 0xFFu)

RX_HD float rx_bits_to_f32(uint32_t bits) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(bits);
#else
    union { uint32_t u; float f; } v;
    v.u = bits;
    return v.f;
#endif
}

// IEEE half -> float, exact for every input (subnormals, inf, nan) without cuda_fp16.h.
RX_HD float rx_f16(uint32_t h) {
    uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
    if (exp == 0x1F) return rx_bits_to_f32(sign | 0x7F800000u | (man << 13));
    if (exp == 0) {
        if (man == 0) return rx_bits_to_f32(sign);
        // subnormal: value = man * 2^-24
        float v = (float)man * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return rx_bits_to_f32(sign | ((exp + 112) << 23) | (man << 13));
}

RX_HD float rx_bf16(uint32_t b) { return rx_bits_to_f32(b << 16); }

// Q4_K / Q5_K: 8 sub-blocks of 32 weights, each with a 6-bit scale and 6-bit min packed in 12 bytes.
RX_HD void rx_k4_scale_min(const uint8_t* scales, int sub, float* sc, float* mn) {
    uint32_t s, m;
    if (sub < 4) {
        s = scales[sub] & 63u;
        m = scales[sub + 4] & 63u;
    } else {
        s = (scales[sub + 4] & 0x0Fu) | ((scales[sub - 4] >> 6) << 4);
        m = (scales[sub + 4] >> 4) | ((scales[sub] >> 6) << 4);
    }
    *sc = (float)s;
    *mn = (float)m;
}

RX_HD void dequant8_f32(const uint8_t* row, int g, float* out) {
    const uint8_t* p = row + 32 * g;
#ifdef __CUDA_ARCH__
    float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w, out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
#else
    for (int i = 0; i < 8; i++) out[i] = rx_bits_to_f32(rx_u32(p + 4 * i));
#endif
}

// 8 halves (16 bytes) of a 16-byte aligned group, as four 32-bit words.
RX_HD void rx_ld16(const uint8_t* p, uint32_t* w) {
#ifdef __CUDA_ARCH__
    uint4 v = *reinterpret_cast<const uint4*>(p);
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
#else
    for (int i = 0; i < 4; i++) w[i] = rx_u32(p + 4 * i);
#endif
}

RX_HD void dequant8_f16(const uint8_t* row, int g, float* out) {
    uint32_t w[4];
    rx_ld16(row + 16 * g, w);
    for (int i = 0; i < 4; i++) out[2 * i] = rx_f16(w[i] & 0xFFFFu), out[2 * i + 1] = rx_f16(w[i] >> 16);
}

RX_HD void dequant8_bf16(const uint8_t* row, int g, float* out) {
    uint32_t w[4];
    rx_ld16(row + 16 * g, w);
    for (int i = 0; i < 4; i++) out[2 * i] = rx_bf16(w[i] & 0xFFFFu), out[2 * i + 1] = rx_bf16(w[i] >> 16);
}

// Q8_0: 34-byte blocks of 32: f16 scale d, 32 int8 q; w = d * q.
RX_HD void dequant8_q8_0(const uint8_t* row, int g, float* out) {
    const uint8_t* b = row + 34 * (g >> 2);
    float d = rx_f16(rx_u16(b));
    uint64_t q = rx_ld8_a2(b + 2 + 8 * (g & 3));
    for (int i = 0; i < 8; i++) out[i] = d * (float)(int8_t)RX_BYTE(q, i);
}

// Q4_0: 18-byte blocks of 32: f16 d, 16 bytes; weight j < 16 is the low nibble of byte j,
// weight j + 16 the high nibble; w = d * (nibble - 8).
RX_HD void dequant8_q4_0(const uint8_t* row, int g, float* out) {
    const uint8_t* b = row + 18 * (g >> 2);
    float d = rx_f16(rx_u16(b));
    int part = g & 3;  // weights 8*part .. 8*part+7 of the block
    uint64_t q = rx_ld8_a2(b + 2 + 8 * (part & 1));
    int shift = (part >> 1) * 4;
    for (int i = 0; i < 8; i++) out[i] = d * (float)((int)((RX_BYTE(q, i) >> shift) & 15) - 8);
}

// Q5_0: 22-byte blocks of 32: f16 d, 32-bit qh (5th bits), 16 bytes of nibbles as in Q4_0;
// w = d * (q - 16).
RX_HD void dequant8_q5_0(const uint8_t* row, int g, float* out) {
    const uint8_t* b = row + 22 * (g >> 2);
    float d = rx_f16(rx_u16(b));
    uint32_t qh = rx_u32(b + 2);
    int part = g & 3;
    uint64_t q = rx_ld8_a2(b + 6 + 8 * (part & 1));
    int shift = (part >> 1) * 4;
    for (int i = 0; i < 8; i++) {
        int j = 8 * part + i;  // weight index inside the block
        int v = ((RX_BYTE(q, i) >> shift) & 15) | (((qh >> j) & 1) << 4);
        out[i] = d * (float)(v - 16);
    }
}

// Q4_1: 20-byte blocks of 32: f16 d, f16 m, 16 bytes of nibbles laid out as in Q4_0;
// w = d * nibble + m. Blocks sit at multiples of 20 bytes: 4-byte aligned.
RX_HD void dequant8_q4_1(const uint8_t* row, int g, float* out) {
    const uint8_t* b = row + 20 * (g >> 2);
    uint32_t dm = rx_u32_a4(b);
    float d = rx_f16(dm & 0xFFFFu), m = rx_f16(dm >> 16);
    int part = g & 3;
    uint64_t q = rx_ld8_a4(b + 4 + 8 * (part & 1));
    int shift = (part >> 1) * 4;
    for (int i = 0; i < 8; i++) out[i] = d * (float)((RX_BYTE(q, i) >> shift) & 15) + m;
}

// Q5_1: 24-byte blocks of 32: f16 d, f16 m, 32-bit qh (5th bits), 16 bytes of nibbles as in
// Q4_0; w = d * q + m. Blocks sit at multiples of 24 bytes: 8-byte aligned.
RX_HD void dequant8_q5_1(const uint8_t* row, int g, float* out) {
    const uint8_t* b = row + 24 * (g >> 2);
    uint32_t dm = rx_u32_a4(b);
    float d = rx_f16(dm & 0xFFFFu), m = rx_f16(dm >> 16);
    uint32_t qh = rx_u32_a4(b + 4);
    int part = g & 3;
    uint64_t q = rx_ld8_a8(b + 8 + 8 * (part & 1));
    int shift = (part >> 1) * 4;
    for (int i = 0; i < 8; i++) {
        int j = 8 * part + i;  // weight index inside the block
        int v = ((RX_BYTE(q, i) >> shift) & 15) | (((qh >> j) & 1) << 4);
        out[i] = d * (float)v + m;
    }
}

// Q4_K: 144-byte super-blocks of 256: f16 d, f16 dmin, 12 scale bytes, 128 bytes of nibbles.
// Weights 64c .. 64c+31 are the low nibbles of qs[32c ..], 64c+32 .. 64c+63 the high nibbles.
// w = d * scale(sub) * q - dmin * min(sub).
RX_HD void dequant8_q4_k(const uint8_t* row, int g, float* out) {
    const uint8_t* b = row + 144 * (g >> 5);
    int e = 8 * (g & 31);  // first weight inside the super-block
    int sub = e >> 5;
    float sc, mn;
    rx_k4_scale_min(b + 4, sub, &sc, &mn);
    float d = rx_f16(rx_u16(b)) * sc, m = rx_f16(rx_u16(b + 2)) * mn;
    uint64_t q = rx_ld8_a8(b + 16 + 32 * (sub >> 1) + (e & 31));
    int shift = (sub & 1) * 4;
    for (int i = 0; i < 8; i++) out[i] = d * (float)((RX_BYTE(q, i) >> shift) & 15) - m;
}

// Q5_K: 176-byte super-blocks: d, dmin, 12 scale bytes, 32 bytes qh, 128 bytes qs. The 5th bit of
// weight e is bit (2c + hi) of qh[e % 32], where c = e / 64 and hi says which nibble.
RX_HD void dequant8_q5_k(const uint8_t* row, int g, float* out) {
    const uint8_t* b = row + 176 * (g >> 5);
    int e = 8 * (g & 31);
    int sub = e >> 5;
    float sc, mn;
    rx_k4_scale_min(b + 4, sub, &sc, &mn);
    float d = rx_f16(rx_u16(b)) * sc, m = rx_f16(rx_u16(b + 2)) * mn;
    uint64_t qh = rx_ld8_a8(b + 16 + (e & 31));
    uint64_t q = rx_ld8_a8(b + 48 + 32 * (sub >> 1) + (e & 31));
    int shift = (sub & 1) * 4;
    for (int i = 0; i < 8; i++) {
        int v = ((RX_BYTE(q, i) >> shift) & 15) | (((RX_BYTE(qh, i) >> sub) & 1) << 4);
        out[i] = d * (float)v - m;
    }
}

// Q6_K: 210-byte super-blocks: ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16], f16 d.
// Each half of 128 weights uses ql[64h..], qh[32h..], scales[8h..]; inside a half, quarter r
// (32 weights) takes nibble r/2 of ql[l + 32*(r%2)] and bits 2r..2r+1 of qh[l]; w = d*sc*(q - 32).
RX_HD void dequant8_q6_k(const uint8_t* row, int g, float* out) {
    const uint8_t* b = row + 210 * (g >> 5);
    int e = 8 * (g & 31);
    int half = e >> 7, r = (e >> 5) & 3, l0 = e & 31;
    uint64_t ql = rx_ld8_a2(b + 64 * half + 32 * (r & 1) + l0);
    uint64_t qh = rx_ld8_a2(b + 128 + 32 * half + l0);
    float d = rx_f16(rx_u16(b + 208));
    int nib = (r >> 1) * 4, hs = 2 * r;
    float sc = d * (float)(int8_t)b[192 + 8 * half + (l0 >> 4) + 2 * r];
    for (int i = 0; i < 8; i++) {
        int v = ((RX_BYTE(ql, i) >> nib) & 15) | (((RX_BYTE(qh, i) >> hs) & 3) << 4);
        out[i] = sc * (float)(v - 32);
    }
}

// Bytes per row of K weights, for the types above.
RX_HD long rx_row_bytes(int type, long k) {
    switch (type) {
        case RX_F32: return 4 * k;
        case RX_F16: case RX_BF16: return 2 * k;
        case RX_Q8_0: return k / 32 * 34;
        case RX_Q4_0: return k / 32 * 18;
        case RX_Q5_0: return k / 32 * 22;
        case RX_Q4_1: return k / 32 * 20;
        case RX_Q5_1: return k / 32 * 24;
        case RX_Q4_K: return k / 256 * 144;
        case RX_Q5_K: return k / 256 * 176;
        case RX_Q6_K: return k / 256 * 210;
    }
    return -1;
}
