#!/usr/bin/env python3
"""Runs order.cu's probe as order2.patch extends it (nvcc -cubin -arch=sm_90a order.cu -o order.cubin): for each mode and
delay, 40 launches on fresh cold tiles, and prints, over all blocks of all launches, the median and
p90 of the cycles that loading x took and of the cycles until the tile landed (both counted after
the delay), and the cycles issuing the tile took."""
import ctypes
import sys

import numpy as np
from cuda.bindings import driver as cu


def ck(r):
    err = r[0] if isinstance(r, tuple) else r
    assert int(err) == 0, r
    return r[1] if isinstance(r, tuple) and len(r) == 2 else r[1:] if isinstance(r, tuple) else None


ck(cu.cuInit(0))
dev = ck(cu.cuDeviceGet(0))
ctx = ck(cu.cuDevicePrimaryCtxRetain(dev))
ck(cu.cuCtxSetCurrent(ctx))
sms = ck(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev))
clk = ck(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CLOCK_RATE, dev))
mod = ck(cu.cuModuleLoadData(open(sys.argv[1] if len(sys.argv) > 1 else "order.cubin", "rb").read()))
probe = ck(cu.cuModuleGetFunction(mod, b"order_probe"))
wx = ck(cu.cuModuleGetFunction(mod, b"order_write_x"))
TILE = 65536
ck(cu.cuFuncSetAttribute(probe, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, TILE))
reps = 40
cold_bytes = (reps + 1) * sms * TILE * 8
cold = ck(cu.cuMemAlloc(cold_bytes))
ck(cu.cuMemsetD8(cold, 1, cold_bytes))
x = ck(cu.cuMemAlloc(4096))
sink = ck(cu.cuMemAlloc(4 * sms))
stamps = ck(cu.cuMemAlloc(32 * sms))
flush = ck(cu.cuMemAlloc(256 << 20))


def launch(f, grid, block, shmem, *args):
    vals = [ctypes.c_void_p(a) if isinstance(a, int) and a > 1 << 32 else a for a in args]
    ptrs = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
    ck(cu.cuLaunchKernel(f, grid, 1, 1, block, 1, 1, shmem, 0, ctypes.addressof(ptrs), 0))


names = {0: "no tile", 1: "cp.async all warps", 2: "cp.async warps 0-3, x on warp 4", 3: "TMA bulk (thread 0)",
         4: "L2 prefetch only", 5: "cp.async all, x ld.cg", 6: "cp.async warps 0-3, x on warp 0",
         7: "cp.async all, x by TMA", 8: "TMA tile, x by TMA", 9: "cp.async all, x ld.global.nc"}
print(f"{sms} SMs, clock {clk / 1e3:.0f} MHz; cycles (median / p90 over blocks x {reps})")
print(f"{'mode':<34} {'tile':>6} {'grid':>5} {'delay':>6} {'issue':>7} {'x in':>13} {'tile in':>13}")
k = 0
cases = [(m, 32768, sms, d) for d in (0, 3000) for m in range(10)]
cases += [(1, tb, g, 0) for tb in (8192, 16384, 65536) for g in (sms, sms // 4)] + [(3, tb, sms, 0) for tb in (8192, 65536)]
for mode, tile, grid, delay in cases:
    if True:
        rows = []
        for r in range(reps):
            k += 1
            ck(cu.cuMemsetD8(flush, k & 255, 256 << 20))  # L2 now holds none of the tiles
            launch(wx, 4, 256, 0, int(x), ctypes.c_float(1.0))
            base = int(cold) + (k % (8 * (reps + 1) - 1)) * sms * TILE
            launch(probe, grid, 256, tile, base, int(x), int(sink), int(stamps), ctypes.c_int(tile),
                   ctypes.c_int(mode), ctypes.c_int(delay))
            ck(cu.cuCtxSynchronize())
            h = np.zeros(4 * grid, np.int64)
            ck(cu.cuMemcpyDtoH(h.ctypes.data, stamps, h.nbytes))
            rows.append(h.reshape(grid, 4))
        a = np.concatenate(rows)
        q = lambda c: f"{np.median(a[:, c]):>6.0f}/{np.percentile(a[:, c], 90):<6.0f}"
        print(f"{names[mode]:<34} {tile:>6} {grid:>5} {delay:>6} {np.median(a[:, 0]):>7.0f} {q(1)} {q(2)}")
