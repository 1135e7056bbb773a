"""A thin numpy <-> device bridge for the GPU tests (never used by the package itself)."""

import numpy as np


class GpuHarness:
    def __init__(self):
        from reflex_runtime.coldstart import Timeline
        from reflex_runtime.gpu.bootstrap import DeviceBootstrap
        from reflex_runtime.gpu.ops import Ops

        boot = DeviceBootstrap.start(Timeline())
        dev = boot.wait()
        assert dev is not None, boot.error
        self.dev, self.stream = dev, boot.stream
        self.ops = Ops(dev, boot.stream)
        self._allocs = []

    def _check(self, result, what):
        from reflex_runtime.gpu.driver import check

        return check(result, what)

    def put(self, arr) -> int:
        from cuda.bindings import driver as cu

        arr = np.ascontiguousarray(arr)
        ptr = self.dev.alloc(arr.nbytes)
        self._allocs.append(ptr)
        self.dev.sync(self.stream)
        self._check(cu.cuMemcpyHtoD(ptr, arr.ctypes.data, arr.nbytes), "cuMemcpyHtoD")
        return ptr

    def poisoned(self, shape, dtype=np.float32) -> int:
        """Device memory filled with NaN (floats) or -7 (ints): every output must be written."""
        arr = np.full(shape, np.nan if np.dtype(dtype).kind == "f" else -7, dtype=dtype)
        return self.put(arr)

    def get(self, ptr, shape, dtype=np.float32):
        from cuda.bindings import driver as cu

        out = np.empty(shape, dtype=dtype)
        self.sync()
        self._check(cu.cuMemcpyDtoH(out.ctypes.data, ptr, out.nbytes), "cuMemcpyDtoH")
        return out

    def sync(self):
        self.dev.sync(self.stream)

    def free_all(self):
        self.sync()
        for p in self._allocs:
            self.dev.free(p)
        self._allocs.clear()
