// A CPU stand-in for kernels/stage.cuh's copies into shared memory, over tests/host_emu/common.cuh's
// fibers. As on the GPU, a 16-byte cp.async lands only when the thread that issued it waits for its
// group (rx_cp_wait_prior<N> / rx_cp_wait_all: groups counted per thread, in commit order), so a
// kernel that reads a slot before its own wait, or another thread's copies before a barrier after
// theirs, reads what was there before. The kernels' dynamic shared memory is one static buffer
// (blocks run one after another), filled with 0xff bytes (NaN as half and float) at each block's
// start, so nothing a block did not write itself reads as a number; a block that writes past the
// launch's size (emu_set_dyn_bytes) aborts, as the GPU would fault.
#pragma once

#include <cstring>
#include <deque>
#include <vector>

#include "common.cuh"

alignas(16) inline uint8_t rx_dyn_smem[256 * 1024];

namespace emu {
struct Copy {
    void* dst;
    const void* src;
};
struct CopyQueue {  // one thread's copies: the open group and the committed ones
    std::vector<Copy> open;
    std::deque<std::vector<Copy>> groups;
};
inline CopyQueue copies[1024];
inline void land(std::vector<Copy>& g) {
    for (auto& c : g) std::memcpy(c.dst, c.src, 16);
    g.clear();
}
inline size_t dyn_bytes = sizeof(rx_dyn_smem);  // the launch's dynamic shared memory (emu_set_dyn_bytes)
inline void stage_block_start() {
    for (auto& q : copies) q.open.clear(), q.groups.clear();  // a block may leave copies unwaited (unread)
    std::memset(rx_dyn_smem, 0xff, sizeof(rx_dyn_smem));
}
inline void stage_block_end() {  // the 16 KB past the launch's size must still hold the 0xff they started with
    static uint8_t ones[16384];
    static const bool filled = (std::memset(ones, 0xff, sizeof(ones)), true);
    (void)filled;
    size_t n = std::min(sizeof(ones), sizeof(rx_dyn_smem) - dyn_bytes);
    if (std::memcmp(rx_dyn_smem + dyn_bytes, ones, n) != 0) {
        std::fprintf(stderr, "host_emu: block (%u, %u, %u) wrote past the launch's %zu bytes of shared memory\n", bid.x,
                     bid.y, bid.z, dyn_bytes);
        std::abort();
    }
}
inline const bool stage_hooked = (block_start = stage_block_start, block_end = stage_block_end, true);
}  // namespace emu

// The harness gives each launch's dynamic shared memory size (a GPU would fault past it).
extern "C" void emu_set_dyn_bytes(size_t n) { emu::dyn_bytes = n < sizeof(rx_dyn_smem) ? n : sizeof(rx_dyn_smem); }

inline void rx_cp16(void* smem_dst, const void* gsrc) { emu::copies[threadIdx.x].open.push_back({smem_dst, gsrc}); }
inline void rx_cp_commit() {
    auto& q = emu::copies[threadIdx.x];
    q.groups.push_back(std::move(q.open));
    q.open.clear();
}
template <int N>
inline void rx_cp_wait_prior() {
    auto& q = emu::copies[threadIdx.x];
    while ((int)q.groups.size() > N) emu::land(q.groups.front()), q.groups.pop_front();
}
inline void rx_cp_wait_all() {  // cp.async.wait_all: the open group too
    rx_cp_commit();
    rx_cp_wait_prior<0>();
}
