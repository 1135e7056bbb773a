// A CPU stand-in for kernels/stage.cuh's copies into shared memory, over tests/host_emu/common.cuh's
// fibers: a 16-byte cp.async copies at once (commits and waits are no-ops), and the kernels'
// dynamic shared memory is one static buffer (blocks run one after another).
#pragma once

#include <cstring>

#include "common.cuh"

alignas(16) inline uint8_t rx_dyn_smem[256 * 1024];

inline void rx_cp16(void* smem_dst, const void* gsrc) { std::memcpy(smem_dst, gsrc, 16); }
inline void rx_cp_commit() {}
template <int N>
inline void rx_cp_wait_prior() {}
inline void rx_cp_wait_all() {}
