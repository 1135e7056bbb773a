// A CPU stand-in for kernels/mma.cuh over tests/host_emu/common.cuh's fibers: cp.async copies at
// once (commits and waits are no-ops), a shared address is an offset into emu::smem (the block's
// dynamic shared memory; tests/host_emu_harness.py points the kernels' extern array at it), and
// mma.sync m16n8k16 and ldmatrix are warp-collective through exchange buffers: every lane leaves its
// fragments, then each computes its own four accumulators from the whole 16 x 16 and 16 x 8 tiles
// (in float: f16 products are exact there; the tensor cores' order of the sum is not reproduced).
#pragma once

#define dim3 cuda_dim3  // as gemm_host.cpp: the stand-in has its own dim3
#include <cuda_fp16.h>
#undef dim3

#include <cstring>

#define RX_SM80 1

namespace emu {
alignas(16) inline unsigned char smem[256 * 1024];
struct MmaIn {
    uint32_t a[4], b[2];
};
inline MmaIn mma_buf[32][32];
inline const uint16_t* ldsm_rows[32][32];  // ldmatrix: each lane's row address
}  // namespace emu

inline uint32_t rx_saddr(const void* p) { return (uint32_t)((const unsigned char*)p - emu::smem); }
inline void rx_cp16s_if(uint32_t s, const void* g, bool p) {
    if (p) std::memcpy(emu::smem + s, g, 16);
}
inline void rx_cp16s_part(uint32_t s, const void* g, int n) {
    std::memcpy(emu::smem + s, g, n);
    std::memset(emu::smem + s + n, 0, 16 - n);
}
inline void rx_cp16(void* s, const void* g, int n) {
    std::memcpy(s, g, n);
    std::memset((char*)s + n, 0, 16 - n);
}
template <int N>
inline void rx_cp_wait() {}
inline void rx_cp_commit() {}

inline uint32_t rx_pack_h2(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    uint32_t u;
    std::memcpy(&u, &h, 4);
    return u;
}

inline float emu_half(uint32_t v, int hi) {
    uint16_t u = (uint16_t)(hi ? v >> 16 : v & 0xffffu);
    __half h;
    std::memcpy(&h, &u, 2);
    return __half2float(h);
}

// mma.cuh's fragment layout (g = lane / 4, t = lane % 4): a[0] = A[g][2t..], a[1] = A[g+8][2t..],
// a[2] = A[g][2t+8..], a[3] = A[g+8][2t+8..]; b[0] = B[2t..2t+1][g], b[1] = B[2t+8..2t+9][g];
// c = C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1].
inline void rx_mma(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    emu::mma_buf[warp][lane] = emu::MmaIn{{a0, a1, a2, a3}, {b0, b1}};
    emu::warp_wait();
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; l++) {
        const emu::MmaIn& f = emu::mma_buf[warp][l];
        int g = l >> 2, t = l & 3;
        for (int h = 0; h < 2; h++) {
            A[g][2 * t + h] = emu_half(f.a[0], h), A[g + 8][2 * t + h] = emu_half(f.a[1], h);
            A[g][2 * t + 8 + h] = emu_half(f.a[2], h), A[g + 8][2 * t + 8 + h] = emu_half(f.a[3], h);
            B[2 * t + h][g] = emu_half(f.b[0], h), B[2 * t + 8 + h][g] = emu_half(f.b[1], h);
        }
    }
    emu::warp_wait();  // every lane has read the buffer before the warp's next mma refills it
    int g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; i++) {
        int r = g + 8 * (i >> 1), col = 2 * t + (i & 1);
        float s = 0.f;
        for (int k = 0; k < 16; k++) s += A[r][k] * B[k][col];
        c[i] += s;
    }
}

// ldmatrix .x4 (kernels/mma.cuh): lane l gives row l % 8 of matrix l / 8; lane l receives r[i] =
// matrix i's row l / 4, columns 2 (l % 4) and + 1 (trans: those rows of column l / 4).
inline void emu_ldsm4(uint32_t* r, const void* smem, bool trans) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    emu::ldsm_rows[warp][lane] = static_cast<const uint16_t*>(smem);
    emu::warp_wait();
    int g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; i++) {
        uint16_t lo, hi;
        if (trans) lo = emu::ldsm_rows[warp][8 * i + 2 * t][g], hi = emu::ldsm_rows[warp][8 * i + 2 * t + 1][g];
        else lo = emu::ldsm_rows[warp][8 * i + g][2 * t], hi = emu::ldsm_rows[warp][8 * i + g][2 * t + 1];
        r[i] = (uint32_t)lo | ((uint32_t)hi << 16);
    }
    emu::warp_wait();  // every lane has read the addresses before the warp's next ldmatrix
}
inline void rx_ldsm4(uint32_t* r, const void* smem) { emu_ldsm4(r, smem, false); }
inline void rx_ldsm4_t(uint32_t* r, const void* smem) { emu_ldsm4(r, smem, true); }
