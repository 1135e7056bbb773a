// Experiment (s25): does a load of x (hot in L2) wait behind weight copies issued just before it
// by the same SM? One block per SM, 256 threads; each block first issues a tile of cold weight bytes
// (DRAM) into shared memory, spins `delay` cycles, then every warp loads 4 KB of x and the block
// reduces it (as mvs_load_x). Stamps (clock64, thread 0): after the tile is issued, x in, tile in.
#include <stdint.h>

__device__ __forceinline__ void cp16(void* d, const void* s) {
    unsigned a = (unsigned)__cvta_generic_to_shared(d);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(a), "l"(s) : "memory");
}
__device__ __forceinline__ void mbar_init(uint64_t* b, int n) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"((unsigned)__cvta_generic_to_shared(b)), "r"(n));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_expect(uint64_t* b, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"((unsigned)__cvta_generic_to_shared(b)),
                 "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, unsigned phase) {
    unsigned a = (unsigned)__cvta_generic_to_shared(b);
    asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}" ::"r"(a),
                 "r"(phase) : "memory");
}
__device__ __forceinline__ void bulk(void* d, const void* s, unsigned n, uint64_t* b) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     (unsigned)__cvta_generic_to_shared(d)),
                 "l"(s), "r"(n), "r"((unsigned)__cvta_generic_to_shared(b)) : "memory");
}
__device__ __forceinline__ void prefetch_l2(const void* s, unsigned n) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(s), "r"(n) : "memory");
}

extern __shared__ __align__(128) uint8_t smem[];

// mode: 0 no tile; 1 cp.async by all threads; 2 cp.async by warps 0-3, x timed on warp 4 (no block
// reduce); 3 TMA bulk copies (thread 0); 4 L2 prefetch only; 5 like 1 with x loaded via ld.global.cg;
// 6 like 2 but x timed on warp 0 (a warp that issued copies); 7 cp.async all, x by one TMA bulk copy into shared
// memory; 8 TMA tile and TMA x; 9 cp.async all, x via ld.global.nc
extern "C" __global__ void order_probe(const uint8_t* __restrict__ cold, const float* x, float* sink,
                                       long long* stamps, int tile, int mode, int delay) {
    __shared__ uint64_t bar, xbar;
    __shared__ float red[8];
    __shared__ __align__(128) float xs[1024];
    const uint8_t* src = cold + (long)blockIdx.x * tile;
    int t = threadIdx.x, warp = t >> 5, lane = t & 31;
    if (t == 0 && (mode == 3 || mode == 8)) mbar_init(&bar, 1);
    if (t == 0 && (mode == 7 || mode == 8)) mbar_init(&xbar, 1);
    __syncthreads();
    long long c0 = clock64();
    if (mode == 1 || mode == 5 || mode == 7 || mode == 9) {
        for (int o = 16 * t; o < tile; o += 16 * 256) cp16(smem + o, src + o);
    } else if (mode == 2 || mode == 6) {
        if (warp < 4) for (int o = 16 * t; o < tile; o += 16 * 128) cp16(smem + o, src + o);
    } else if (mode == 3 || mode == 8) {
        if (t == 0) {
            mbar_expect(&bar, tile);
            for (int o = 0; o < tile; o += 4096) bulk(smem + o, src + o, min(4096, tile - o), &bar);
        }
    } else if (mode == 4) {
        if (t < tile / 4096) prefetch_l2(src + 4096 * t, 4096);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    long long c1 = clock64();
    while (clock64() - c1 < delay) {}
    long long c2 = clock64();
    int xw = mode == 2 ? 4 : 0;
    float s = 0.f;
    if (mode == 2 || mode == 6) {  // one warp, its own 4 KB read
        if (warp == xw) {
            for (int i = 0; i < 8; i++) {
                float4 v = reinterpret_cast<const float4*>(x)[lane + 32 * i];
                s += v.x + v.y + v.z + v.w;
            }
            for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(~0u, s, o);
        }
    } else {
        if (mode == 7 || mode == 8) {
            if (t == 0) mbar_expect(&xbar, 4096), bulk(xs, x, 4096, &xbar);
            mbar_wait(&xbar, 0);
        }
        for (int i = 0; i < 8; i++) {
            float4 v;
            if (mode == 7 || mode == 8) {
                v = reinterpret_cast<const float4*>(xs)[lane + 32 * i];
            } else if (mode == 9) {
                v = __ldg(reinterpret_cast<const float4*>(x) + lane + 32 * i);
            } else if (mode == 5) {
                const float4* p = reinterpret_cast<const float4*>(x) + lane + 32 * i;
                asm volatile("ld.global.cg.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
            } else {
                v = reinterpret_cast<const float4*>(x)[lane + 32 * i];
            }
            s += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
        for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(~0u, s, o);
        if (lane == 0) red[warp] = s;
        __syncthreads();
        s = red[0];
    }
    long long c3 = clock64();
    if (t == 32 * xw && s == 12345.f) sink[blockIdx.x] = s;  // keeps the loads
    asm volatile("cp.async.wait_all;" ::: "memory");
    if (mode == 3 || mode == 8) mbar_wait(&bar, 0);
    __syncthreads();
    long long c4 = clock64();
    if (t == 32 * xw) {
        long long* st = stamps + 4 * blockIdx.x;
        st[0] = c1 - c0, st[1] = c3 - c2, st[2] = c4 - c2, st[3] = smem[t * 16 % tile] + (long long)(s != s);
    }
}

// Writes x (4 KB) from one block, as the predecessor kernel would: x is then dirty in L2.
extern "C" __global__ void order_write_x(float* x, float v) { x[threadIdx.x + 256 * blockIdx.x] = v + threadIdx.x; }
