// A CPU stand-in for kernels/mma.cuh over tests/host_emu/common.cuh's fibers: cp.async copies at
// once (commits and waits are no-ops), a shared address is an offset into emu::smem (the block's
// dynamic shared memory; tests/host_emu_harness.py points the kernels' extern array at it), and
// ldmatrix is warp-collective through an exchange buffer (the products: mma_ops.cuh's stand-in).
#pragma once

#define dim3 cuda_dim3  // as gemm_host.cpp: the stand-in has its own dim3
#include <cuda_fp16.h>
#undef dim3

#include <cstring>

#include "mma_ops.cuh"  // rx_mma, rx_pack_h2 (and RX_SM80)

namespace emu {
alignas(16) inline unsigned char smem[256 * 1024];
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
