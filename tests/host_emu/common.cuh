// A CPU stand-in for kernels/common.cuh, so kernels that use only the CUDA features below can be
// compiled by g++ and run on the host (tests/test_delta_net_host.py). The threads of a block are
// fibers (ucontext) on one OS thread, switched at every barrier: __syncthreads waits for every
// live thread of the block, a warp shuffle for every live lane of its warp (through an exchange
// buffer), and a thread that returns stops counting, as on the GPU. Blocks run one after another.
// A barrier nobody can pass aborts with a message (a hang on the GPU). The kernels' own indexing,
// barriers and shuffles run; memory races between threads do not show (fibers run in turn).
#pragma once

#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

namespace emu {
struct Fiber {
    ucontext_t ctx;
    std::vector<char> stack;
    bool done = false;
    int wait = 0;  // 0: runnable, 1: at a block barrier, 2: at a warp barrier
    unsigned gen = 0;
};
inline dim3 tid, bid, bdim, gdim;
inline std::vector<Fiber> fibers;
inline ucontext_t scheduler;
inline int cur = 0;
inline unsigned live = 0, block_gen = 0, block_arrived = 0;
inline unsigned warp_live[32], warp_gen[32], warp_arrived[32];
inline float warp_buf[32][32];
inline std::function<void()> body;
inline void (*block_start)() = nullptr;  // set by a stand-in that keeps per-block state (stage.cuh)
inline void (*block_end)() = nullptr;    // and one that checks what the block left (stage.cuh)

inline void release_if_complete(int warp) {
    if (block_arrived && block_arrived == live) block_arrived = 0, block_gen++;
    if (warp_arrived[warp] && warp_arrived[warp] == warp_live[warp]) warp_arrived[warp] = 0, warp_gen[warp]++;
}

inline void block_wait() {
    Fiber& f = fibers[cur];
    f.wait = 1, f.gen = block_gen, block_arrived++;
    release_if_complete(cur >> 5);
    swapcontext(&f.ctx, &scheduler);
}

inline void warp_wait() {
    Fiber& f = fibers[cur];
    int w = cur >> 5;
    f.wait = 2, f.gen = warp_gen[w], warp_arrived[w]++;
    release_if_complete(w);
    swapcontext(&f.ctx, &scheduler);
}

inline void trampoline() {
    body();
    fibers[cur].done = true;
    live--, warp_live[cur >> 5]--;
    release_if_complete(cur >> 5);
}  // returns to the scheduler through uc_link

inline bool runnable(const Fiber& f, int i) {
    if (f.done) return false;
    if (f.wait == 1) return block_gen > f.gen;
    if (f.wait == 2) return warp_gen[i >> 5] > f.gen;
    return true;
}

inline void run_block(unsigned threads) {
    fibers.assign(threads, Fiber{});
    live = threads, block_gen = block_arrived = 0;
    for (int w = 0; w < 32; w++) warp_live[w] = warp_gen[w] = warp_arrived[w] = 0;
    for (unsigned t = 0; t < threads; t++) warp_live[t >> 5]++;
    for (auto& f : fibers) {
        f.stack.resize(1 << 16);
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack.data();
        f.ctx.uc_stack.ss_size = f.stack.size();
        f.ctx.uc_link = &scheduler;
        makecontext(&f.ctx, trampoline, 0);
    }
    while (live) {
        bool progressed = false;
        for (unsigned i = 0; i < threads; i++) {
            if (!runnable(fibers[i], i)) continue;
            cur = (int)i, tid = dim3{i, 0, 0}, fibers[i].wait = 0;
            swapcontext(&scheduler, &fibers[i].ctx);
            progressed = true;
        }
        if (!progressed) {
            std::fprintf(stderr, "host_emu: block (%u, %u, %u) deadlocks at a barrier\n", bid.x, bid.y, bid.z);
            std::abort();
        }
    }
}
}  // namespace emu

#define threadIdx (emu::tid)
#define blockIdx (emu::bid)
#define blockDim (emu::bdim)
#define gridDim (emu::gdim)
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define RX_WARP 32

inline void __syncthreads() { emu::block_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::warp_wait(); }

inline float emu_exchange(float v, int src) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    emu::warp_buf[warp][lane] = v;
    emu::warp_wait();
    float r = emu::warp_buf[warp][src & 31];
    emu::warp_wait();
    return r;
}
inline float __shfl_sync(unsigned, float v, int src) { return emu_exchange(v, src); }
inline float __shfl_xor_sync(unsigned, float v, int m) { return emu_exchange(v, (threadIdx.x & 31) ^ m); }
inline int __shfl_xor_sync(unsigned, int v, int m) {  // the bits travel through the float buffer
    float f;
    std::memcpy(&f, &v, 4);
    f = emu_exchange(f, (threadIdx.x & 31) ^ m);
    std::memcpy(&v, &f, 4);
    return v;
}
inline float __shfl_up_sync(unsigned, float v, int d) {
    int lane = threadIdx.x & 31;
    return emu_exchange(v, lane >= d ? lane - d : lane);
}
inline int __all_sync(unsigned, int p) {  // every lane exchanges its vote
    float v = p ? 1.f : 0.f;
    for (int o = 16; o > 0; o >>= 1) v = std::fmin(v, emu_exchange(v, (threadIdx.x & 31) ^ o));
    return v > 0.5f;
}
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
using std::max;
using std::min;

inline void rx_pdl_begin() {}
inline void rx_pdl_weights_first() {}

// device memory intrinsics: fibers run in turn, so nothing interleaves and every load is coherent
inline void __threadfence() {}
template <class T>
inline T __ldg(const T* p) { return *p; }
template <class T>
inline T __ldcg(const T* p) { return *p; }
template <class T>
inline T atomicAdd(T* p, T v) {
    T old = *p;
    *p += v;
    return old;
}

// kernels/common.cuh's last-block election for split merges (the fence is a no-op here)
struct BlockSync {
    void operator()() const { __syncthreads(); }
};
template <typename Sync>
inline bool split_last(int* counter, int n, int& flag, Sync sync) {
    sync();
    if (threadIdx.x == 0) flag = atomicAdd(counter, 1) == n - 1;
    sync();
    return flag;
}

inline void rx_prefetch_l2(const void*) {}  // a hint only

// kernels/common.cuh's paged-cache row
#define RX_KV_BLOCK 16
inline long rx_kv_row(const int* blocks, int j) {
    return blocks ? (long)blocks[j / RX_KV_BLOCK] * RX_KV_BLOCK + j % RX_KV_BLOCK : (long)j;
}

inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

inline float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = std::fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// kernels/common.cuh's block reductions, written again over the stand-ins above.
inline float block_sum(float v, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    return warp_sum(lane < n_warps ? scratch[lane] : 0.0f);
}

inline float block_max(float v, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    return warp_max(lane < n_warps ? scratch[lane] : -INFINITY);
}

// Run kernel(args...) over grid (gx, gy, gz) with `threads` (<= 1024) threads per block.
template <typename... P, typename... A>
void emu_launch(void (*kernel)(P...), dim3 grid, unsigned threads, A... args) {
    emu::bdim = dim3{threads, 1, 1};
    emu::gdim = grid;
    emu::body = [=] { kernel(args...); };
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                emu::bid = dim3{x, y, z};
                if (emu::block_start) emu::block_start();
                emu::run_block(threads);
                if (emu::block_end) emu::block_end();
            }
}
