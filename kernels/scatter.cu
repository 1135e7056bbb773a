// scatter.cu: the pieces of one staging pack, copied from where the pack landed in device scratch
// to their places in the weights arena. gpu/residency.py packs several small routed experts into
// one host-to-device copy (one DMA and a few driver calls instead of one per expert); this kernel
// puts each piece where the file layout says. The pack starts with n RxPiece rows (ops/scatter.py
// writes them), its bytes follow. Grid (pieces, slices): block (x, y) copies slice y of piece x,
// 16 bytes a thread when both ends are 16-byte aligned, else bytes. Bound by the pack's bytes,
// read and written once (device to device, ~3 TB/s: a 2 MB pack is about a microsecond).
#include "common.cuh"

struct RxPiece {
    unsigned long long dst;  // destination address
    unsigned int src;        // the piece's offset in the pack (a multiple of 16)
    unsigned int n;          // bytes
};

extern "C" __global__ void reflex_scatter_pieces(const uint8_t* pack, int n_pieces) {
    rx_pdl_begin();
    if ((int)blockIdx.x >= n_pieces) return;
    const RxPiece p = reinterpret_cast<const RxPiece*>(pack)[blockIdx.x];
    const uint8_t* s = pack + p.src;
    uint8_t* d = reinterpret_cast<uint8_t*>(p.dst);
    // this block's slice, a multiple of 16 bytes long so every slice starts as aligned as the piece
    const size_t per = ((p.n + gridDim.y - 1) / gridDim.y + 15) & ~(size_t)15;
    const size_t lo = blockIdx.y * per, hi = min(lo + per, (size_t)p.n);
    if (lo >= hi) return;
    size_t i = lo;
    if ((((uintptr_t)s | (uintptr_t)d) & 15) == 0) {
        const size_t vec_hi = lo + ((hi - lo) & ~(size_t)15);
        for (size_t v = lo + 16 * threadIdx.x; v < vec_hi; v += 16 * blockDim.x)
            *reinterpret_cast<uint4*>(d + v) = *reinterpret_cast<const uint4*>(s + v);
        i = vec_hi;
    }
    for (i += threadIdx.x; i < hi; i += blockDim.x) d[i] = s[i];
}
