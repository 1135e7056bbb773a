// stage_run.cuh: a run of bytes staged into shared memory by stage.cuh's copies (described there),
// apart from them so that the CPU emulation (tests/host_emu/stage.cuh) runs this code on its copies.
#pragma once

#include "stage.cuh"

// Smem bytes rx_stage needs for a run of n bytes: its 16-byte chunks plus up to 30 bytes of
// alignment slack, rounded to 16 (the host's mvs_stage_bytes must say the same).
__host__ __device__ __forceinline__ long rx_stage_bytes(long n) { return (n + 30 + 15) & ~15L; }

// Block-wide: start copying bytes [src, src + n) (src and n even) into smem_base (16-aligned).
// Returns where src's first byte lands: smem_base + (src mod 16). Every thread of the block must
// call it with the same arguments (or, with t / nt, threads t = 0 .. nt - 1 of a part of it, nt
// >= 16); before reading the bytes: rx_cp_commit / rx_cp_wait_all (or rx_cp_wait_prior) and
// __syncthreads(). Reads exactly the bytes of the run, nothing around it.
__device__ __forceinline__ const uint8_t* rx_stage(uint8_t* smem_base, const uint8_t* src, long n, int t = -1,
                                                   int nt = 0) {
    uintptr_t a = reinterpret_cast<uintptr_t>(src), b = a + n;
    uintptr_t lo = a & ~(uintptr_t)15, a16 = (a + 15) & ~(uintptr_t)15, b16 = b & ~(uintptr_t)15;
    if (t < 0) t = threadIdx.x, nt = blockDim.x;
    if (a16 < b16) {
        for (uintptr_t p = a16 + 16 * (uintptr_t)t; p < b16; p += 16 * (uintptr_t)nt)
            rx_cp16(smem_base + (p - lo), reinterpret_cast<const void*>(p));
        // the head [a, a16) and the tail [b16, b): fewer than 8 halves each
        uintptr_t p = t < 8 ? a + 2 * t : b16 + 2 * (t - 8);
        if (t < 16 && p < (t < 8 ? a16 : b))
            *reinterpret_cast<uint16_t*>(smem_base + (p - lo)) = __ldg(reinterpret_cast<const unsigned short*>(p));
    } else {  // under 32 bytes with no whole aligned chunk inside
        for (uintptr_t p = a + 2 * (uintptr_t)t; p < b; p += 2 * (uintptr_t)nt)
            *reinterpret_cast<uint16_t*>(smem_base + (p - lo)) = __ldg(reinterpret_cast<const unsigned short*>(p));
    }
    return smem_base + (a - lo);
}

// rx_stage for a caller whose run sits inside a readable allocation with room around it (the
// model's arena: weights, then the rest): copies the whole 16-byte chunks that cover the run, all
// with cp.async, so no thread waits for a load here (rx_stage's 2-byte head and tail copies are
// plain loads, which stall their threads until the data arrives). Threads t = 0 .. nt - 1 of the
// block take part; the bytes land as rx_stage places them, within rx_stage_bytes(n).
__device__ __forceinline__ const uint8_t* rx_stage_hull(uint8_t* smem_base, const uint8_t* src, long n, int t,
                                                        int nt) {
    uintptr_t a = reinterpret_cast<uintptr_t>(src), lo = a & ~(uintptr_t)15, hi = (a + n + 15) & ~(uintptr_t)15;
    for (uintptr_t p = lo + 16 * (uintptr_t)t; p < hi; p += 16 * (uintptr_t)nt)
        rx_cp16(smem_base + (p - lo), reinterpret_cast<const void*>(p));
    return smem_base + (a - lo);
}
