"""Stand-ins for gpu.driver.Device with no GPU behind it. FakeDevice, shared by the launch-ABI tests
and the host-time benchmark (scripts/bench_host.py): memory is address ranges, copies and memsets
check their ranges, and each launch's ctypes argument pack is checked against the kernel's PTX
parameter sizes (FakeKernel). HostMemoryDevice: host memory for the upload's tests and
scripts/bench_upload_gil.py."""

import ctypes


class FakeKernel:
    def __init__(self, name, dev):
        self.name, self.dev = name, dev

    def launch(self, grid, block, args, stream, shmem=0, pdl=False, cooperative=False, carveout=None):
        assert (carveout is not None) == pdl, (self.name, carveout)  # the decode graph's launches share one carveout
        if pdl:
            self.dev.carveouts.add(carveout)
        assert 0 <= shmem <= self.dev.max_shared - 1024, (self.name, shmem)  # dynamic + static shared memory
        assert not (pdl and cooperative), "a cooperative launch is not chained by PDL"
        if cooperative:  # every block resident at once
            g = grid if isinstance(grid, tuple) else (grid, 1, 1)
            assert g[0] * g[1] * g[2] <= self.dev.sm_count * self.blocks_per_sm(block, shmem), (self.name, g)
        want = self.dev.params[self.name]
        got = [ctypes.sizeof(a) for a in args]
        assert got == want, f"{self.name}: passed sizes {got}, kernel takes {want}"
        g = grid if isinstance(grid, tuple) else (grid, 1, 1)
        assert all(1 <= d < 2**31 for d in g) and g[1] < 65536 and g[2] < 65536, (self.name, g)
        assert 32 <= block <= 1024 and block % 32 == 0, (self.name, block)
        for a in args:  # device pointers must point into memory we handed out (or be NULL)
            if isinstance(a, ctypes.c_void_p) and a.value:
                assert self.dev.owns(a.value), f"{self.name}: pointer {a.value:#x} is outside every allocation"
        self.dev.launches.append((self.name, g, block))
        self.dev.shmem.append(shmem)
        self.dev.last_args.append(args[-1])
        self.dev.args.append(args)


    def blocks_per_sm(self, block, shmem):
        return min(2048 // block, (self.dev.smem_per_sm - 1024) // max(shmem + 1024, 1))


class FakeDevice:
    """gpu.driver.Device's whole interface with no GPU behind it: memory is address ranges,
    copies and memsets check their ranges, launches check their argument packs (FakeKernel)."""

    name, cc, sm_count, total_mem, driver_version = "fake", (9, 0), 132, 80 << 30, 13000
    cooperative = True
    max_shared, smem_per_sm = 232448, 233472  # sm_90's opt-in limit per block, and per SM

    def __init__(self, params):
        self.params = params
        self.launches = []
        self.carveouts = set()  # the shared-memory carveouts the PDL-chained launches asked for
        self.shmem = []
        self.last_args = []  # each launch's last argument
        self.args = []  # and all of them
        self.copies = []
        self._next = 1 << 32
        self._ranges = []
        self.kernels = {n: FakeKernel(n, self) for n in params}

    def make_current(self):
        pass

    def kernel(self, name):
        return self.kernels[name]

    def resolve_all(self, names):
        return [n for n in names if n not in self.kernels]

    def alloc(self, nbytes):
        p = self._next
        self._ranges.append((p, p + nbytes))
        self._next += -(-nbytes // 4096) * 4096 + 4096
        return p

    def free(self, ptr):
        assert any(a == ptr for a, _ in self._ranges), f"free of {ptr:#x}, which was never allocated"

    def alloc_pinned(self, nbytes):
        buf = (ctypes.c_char * nbytes)()
        self._pinned = getattr(self, "_pinned", []) + [buf]
        return ctypes.addressof(buf), memoryview(buf).cast("B")

    def free_pinned(self, ptr):
        held = getattr(self, "_pinned", [])
        assert any(ctypes.addressof(b) == ptr for b in held), "freeing host memory this device did not pin"
        self._pinned = [b for b in held if ctypes.addressof(b) != ptr]

    def register_host(self, ptr, nbytes):
        assert ptr % 4096 == 0, "cuMemHostRegister takes page-aligned memory"

    def unregister_host(self, ptr):
        pass

    def owns(self, ptr, nbytes=1):
        return any(a <= ptr and ptr + nbytes <= b for a, b in self._ranges)

    def _device_range(self, ptr, nbytes, what):
        assert self.owns(ptr, nbytes), f"{what}: [{ptr:#x}, +{nbytes}) is outside every allocation"
        self.copies.append((what, ptr, nbytes))

    def memset32(self, ptr, value, count, stream):
        self._device_range(ptr, 4 * count, "memset32")

    def memset8(self, ptr, value, count, stream):
        self._device_range(ptr, count, "memset8")

    def htod(self, dst, src_ptr, nbytes, stream):
        self._device_range(dst, nbytes, "htod")

    def dtoh(self, dst_ptr, src, nbytes, stream):
        self._device_range(src, nbytes, "dtoh")

    def dtod(self, dst, src, nbytes, stream):
        self._device_range(dst, nbytes, "dtod")
        self._device_range(src, nbytes, "dtod")

    def mem_info(self):
        return self.total_mem, self.total_mem

    def stream(self):
        return object()

    def sync(self, stream):
        pass

    def event(self, timing=False):
        return object()

    def record(self, event, stream):
        pass

    def wait_event(self, event):
        pass

    def elapsed_ms(self, start, end):
        return 0.0

    def begin_capture(self, stream):
        pass

    def end_capture(self, stream):
        return FakeGraph()


class FakeGraph:
    n_nodes = 0

    def launch(self, stream):
        pass


class FakeBoot:
    def __init__(self, dev):
        self.dev, self.stream, self.error, self.kernel_format = dev, None, None, "fake"

    def wait(self):
        return self.dev


class HostMemoryDevice:
    """A device whose memory is one host buffer of `size` bytes (`mem`, at address `base`) and whose
    async copies are memmoves done at once (ctypes drops the GIL for them, as a driver call does):
    what gpu/upload.py needs of a device, for its tests and scripts/bench_upload_gil.py."""

    def __init__(self, size: int):
        self.mem = (ctypes.c_char * size)()
        self.base = ctypes.addressof(self.mem)
        self.pinned: dict[int, object] = {}
        self.registered: dict[int, int] = {}

    def make_current(self):
        pass

    def alloc_pinned(self, n):
        buf = (ctypes.c_char * n)()
        ptr = ctypes.addressof(buf)
        self.pinned[ptr] = buf
        return ptr, memoryview(buf).cast("B")

    def free_pinned(self, ptr):
        del self.pinned[ptr]

    def register_host(self, ptr, n):
        assert ptr % 4096 == 0 and n % 4096 == 0
        self.registered[ptr] = n

    def unregister_host(self, ptr):
        del self.registered[ptr]

    def event(self):
        return object()

    def stream(self):
        return object()

    def record(self, ev, stream):
        pass

    def wait_event(self, ev):
        pass

    def sync(self, stream):
        pass

    def htod(self, dst, src, n, stream):
        assert self.base <= dst and dst + n <= self.base + len(self.mem)
        ctypes.memmove(dst, src, n)
