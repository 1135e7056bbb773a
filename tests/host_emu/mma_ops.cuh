// A CPU stand-in for kernels/mma_ops.cuh over tests/host_emu/common.cuh's fibers: mma.sync m16n8k16
// and movmatrix are warp-collective through exchange buffers: every lane leaves its fragments, then
// each computes its own part from the whole tiles (mma in float: f16 products are exact there; the
// tensor cores' order of the sum is not reproduced).
#pragma once

#define dim3 cuda_dim3  // the toolkit's own dim3 (vector_types.h): the stand-in has one
#include <cuda_fp16.h>
#undef dim3

#include <cstdint>
#include <cstring>

#define RX_SM80 1

namespace emu {
struct MmaIn {
    uint32_t a[4], b[2];
};
inline MmaIn mma_buf[32][32];
inline uint32_t movt_buf[32][32];
}  // namespace emu

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

// movmatrix .trans: lane l holds row l / 4, columns 2 (l % 4), + 1 of an 8x8 matrix of halves and
// receives those of its transpose
inline uint32_t rx_movt(uint32_t x) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    emu::movt_buf[warp][lane] = x;
    emu::warp_wait();
    int g = lane >> 2, t = lane & 3;
    uint32_t r = 0;
    for (int h = 0; h < 2; h++) {  // element (2t + h, g): row 2t + h is held by lanes 4 (2t + h) .., column g by lane g / 2
        uint32_t src = emu::movt_buf[warp][4 * (2 * t + h) + g / 2];
        uint32_t e = (g & 1) ? src >> 16 : src & 0xffffu;
        r |= e << (16 * h);
    }
    emu::warp_wait();  // every lane has read the buffer before the warp's next transpose
    return r;
}
