"""A small layer over the CUDA driver API (cuda-python's `cuda.bindings.driver`), nothing else:
no CUDA runtime, NVRTC, cuBLAS or torch. Every CUresult is checked and turned into a
DeviceError that names the call.

Handles are plain ints (device pointers) or the bindings' objects; kernel arguments are ctypes
values whose addresses go into a void* array, which is what cuLaunchKernel copies from (the
same array is copied into a graph node at capture time, so it may be dropped afterwards).
"""

from __future__ import annotations

import ctypes

from cuda.bindings import driver as cu

from ..errors import DeviceError

_SUCCESS = cu.CUresult.CUDA_SUCCESS
_PTR_ARRAYS = [ctypes.c_void_p * n for n in range(48)]  # a launch's void* array by argument count
_addressof = ctypes.addressof


def _error_text(err) -> str:
    try:
        _, name = cu.cuGetErrorName(err)
        _, desc = cu.cuGetErrorString(err)
        return f"{name.decode()}: {desc.decode()}"
    except Exception:  # the error lookup itself failed: still say which code
        return str(err)


def check(result, call: str):
    """Unwrap a bindings call's (CUresult, values...) tuple or raise DeviceError naming `call`."""
    err = result[0]
    if err != _SUCCESS:
        raise DeviceError(f"{call} failed ({_error_text(err)})")
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


class Kernel:
    __slots__ = ("name", "func", "shared_limit", "carveout", "_fits")

    def __init__(self, name: str, func):
        self.name, self.func = name, func
        # dynamic shared memory this kernel was allowed: none until asked (the default allowance is
        # 48 KB minus the kernel's static shared memory, which a launch cannot see)
        self.shared_limit = 0
        self.carveout = -1  # the preferred shared-memory carveout set on it (-1: the driver's choice)
        self._fits: dict[tuple[int, int], int] = {}  # blocks_per_sm's answers: a launch plan asks every step

    def launch(self, grid, block, args, stream, shmem: int = 0, pdl: bool = False, cooperative: bool = False,
               carveout: int | None = None) -> None:
        """args: ctypes values (c_void_p, c_int, c_float, structures...), in kernel order.
        shmem: dynamic shared memory bytes; the kernel's allowance is raised to it on first need
        (up to the device's Device.max_shared). pdl: launch as a programmatic dependent of the previous
        kernel on the stream (sm_90+; the kernels wait for it in rx_pdl_begin). Used while
        capturing the decode graph only: building the launch config costs Python time an eager
        launch should not pay. cooperative: every block resident at once, or the launch waits (a
        grid-wide barrier inside: kernels/fused_step.cu); not with pdl. carveout: the percentage of the
        SM's L1 / shared memory to give shared memory (Launcher.carveout says why), -1 the driver's choice."""
        if shmem > self.shared_limit:
            self._allow_shared(shmem)
        if carveout is not None and carveout != self.carveout:
            attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
            check(cu.cuFuncSetAttribute(self.func, attr, carveout), f"cuFuncSetAttribute({self.name}, carveout)")
            self.carveout = carveout
        # (filled element by element: an eager prompt's host time is per launch, and this is half the
        # cost of the array built from a list: scripts/bench_host.py)
        n = len(args)
        ptrs = _PTR_ARRAYS[n]() if n < len(_PTR_ARRAYS) else (ctypes.c_void_p * n)()
        for i, a in enumerate(args):
            ptrs[i] = _addressof(a)
        gx, gy, gz = grid if isinstance(grid, tuple) else (grid, 1, 1)
        if pdl or cooperative:
            err = cu.cuLaunchKernelEx(_launch_config(gx, gy, gz, block, shmem, stream, cooperative), self.func,
                                      ctypes.addressof(ptrs), 0)[0]
        else:
            err = cu.cuLaunchKernel(self.func, gx, gy, gz, block, 1, 1, shmem, stream, ctypes.addressof(ptrs), 0)[0]
        if err != _SUCCESS:
            raise DeviceError(f"cuLaunchKernel({self.name}, grid={grid}, block={block}) failed ({_error_text(err)})")


    def _allow_shared(self, shmem: int) -> None:
        if shmem > self.shared_limit:
            attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(cu.cuFuncSetAttribute(self.func, attr, shmem), f"cuFuncSetAttribute({self.name}, {shmem} bytes)")
            self.shared_limit = shmem

    def blocks_per_sm(self, block: int, shmem: int) -> int:
        """How many blocks of this shape an SM holds at once (0: not one); the driver is asked once."""
        n = self._fits.get((block, shmem))
        if n is None:
            self._allow_shared(shmem)
            n = self._fits[block, shmem] = int(check(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                self.func, block, shmem), f"cuOccupancyMaxActiveBlocksPerMultiprocessor({self.name})"))
        return n


def _launch_config(gx: int, gy: int, gz: int, block: int, shmem: int, stream, cooperative: bool = False):
    """A launch as a programmatic dependent of the previous kernel, or (cooperative) of co-resident blocks."""
    attr = cu.CUlaunchAttribute()
    if cooperative:
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
        attr.value.cooperative = 1
    else:
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
    cfg = cu.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = gx, gy, gz
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block, 1, 1
    cfg.sharedMemBytes = shmem
    cfg.hStream = stream
    cfg.attrs = [attr]
    cfg.numAttrs = 1
    return cfg


class Device:
    """One GPU's primary context, the fatbin module and a few helpers. Create it on any thread;
    call `make_current()` on every other thread that issues driver calls."""

    def __init__(self, ordinal: int = 0):
        check(cu.cuInit(0), "cuInit")
        self.ordinal = ordinal
        self.dev = check(cu.cuDeviceGet(ordinal), "cuDeviceGet")
        self.name = check(cu.cuDeviceGetName(256, self.dev), "cuDeviceGetName").split(b"\0")[0].decode()
        attr = cu.CUdevice_attribute
        self.cc = (
            check(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.dev), "cuDeviceGetAttribute"),
            check(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.dev), "cuDeviceGetAttribute"),
        )
        self.sm_count = check(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, self.dev),
                              "cuDeviceGetAttribute")
        # shared memory one block may take once opted in (227 KB on sm_90, 99 KB on sm_86/89/120), and
        # one SM holds (the staged decode kernels plan their blocks with both)
        self.max_shared = check(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                                                        self.dev), "cuDeviceGetAttribute")
        self.smem_per_sm = check(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
                                                         self.dev), "cuDeviceGetAttribute")
        # grids whose blocks are all resident at once (kernels/fused_step.cu's barrier needs it)
        self.cooperative = bool(check(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, self.dev),
                                      "cuDeviceGetAttribute"))
        self.total_mem = check(cu.cuDeviceTotalMem(self.dev), "cuDeviceTotalMem")
        self.driver_version = check(cu.cuDriverGetVersion(), "cuDriverGetVersion")
        self.ctx = check(cu.cuDevicePrimaryCtxRetain(self.dev), "cuDevicePrimaryCtxRetain")
        self.make_current()
        self.module = None
        self.kernels: dict[str, Kernel] = {}

    def make_current(self) -> None:
        check(cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")

    # -- module ---------------------------------------------------------------------------

    def load_fatbin(self, image: bytes) -> None:
        """One cuModuleLoadData of the whole fatbin. Kernels are resolved by name on first use:
        a request touches ~12 of them, and on the cold path every driver call from a second
        thread waits for the GIL."""
        self._image = image  # the driver reads it during the call; keep it alive regardless
        self.module = check(cu.cuModuleLoadData(image), "cuModuleLoadData")

    def kernel(self, name: str) -> Kernel:
        k = self.kernels.get(name)
        if k is None:
            err, func = cu.cuModuleGetFunction(self.module, name.encode())
            if err != _SUCCESS:
                raise DeviceError(f"kernel {name} is not in the loaded fatbin ({_error_text(err)})")
            k = self.kernels[name] = Kernel(name, func)
        return k

    def resolve_all(self, names) -> list[str]:
        """Resolve every name now (smoke, tests); returns the names that are missing."""
        missing = []
        for n in names:
            try:
                self.kernel(n)
            except DeviceError:
                missing.append(n)
        return missing

    # -- memory ---------------------------------------------------------------------------

    def alloc(self, nbytes: int) -> int:
        return int(check(cu.cuMemAlloc(max(1, nbytes)), f"cuMemAlloc({nbytes})"))

    def free(self, ptr: int) -> None:
        check(cu.cuMemFree(ptr), "cuMemFree")

    def alloc_pinned(self, nbytes: int) -> tuple[int, memoryview]:
        """Page-locked host memory (for fast async copies) and a writable view of it."""
        ptr = int(check(cu.cuMemHostAlloc(nbytes, 0), f"cuMemHostAlloc({nbytes})"))
        view = memoryview((ctypes.c_char * nbytes).from_address(ptr)).cast("B")
        return ptr, view

    def free_pinned(self, ptr: int) -> None:
        check(cu.cuMemFreeHost(ptr), "cuMemFreeHost")

    def register_host(self, ptr: int, nbytes: int) -> None:
        """Page-lock memory we allocated (gpu/upload.py HugePageRegion) for fast async copies."""
        check(cu.cuMemHostRegister(ptr, nbytes, 0), f"cuMemHostRegister({nbytes})")

    def unregister_host(self, ptr: int) -> None:
        check(cu.cuMemHostUnregister(ptr), "cuMemHostUnregister")

    def memset32(self, ptr: int, value: int, count: int, stream) -> None:
        check(cu.cuMemsetD32Async(ptr, value & 0xFFFFFFFF, count, stream), "cuMemsetD32Async")

    def memset8(self, ptr: int, value: int, count: int, stream) -> None:
        check(cu.cuMemsetD8Async(ptr, value, count, stream), "cuMemsetD8Async")

    def htod(self, dst: int, src_ptr: int, nbytes: int, stream) -> None:
        check(cu.cuMemcpyHtoDAsync(dst, src_ptr, nbytes, stream), "cuMemcpyHtoDAsync")

    def dtoh(self, dst_ptr: int, src: int, nbytes: int, stream) -> None:
        check(cu.cuMemcpyDtoHAsync(dst_ptr, src, nbytes, stream), "cuMemcpyDtoHAsync")

    def dtod(self, dst: int, src: int, nbytes: int, stream) -> None:
        check(cu.cuMemcpyDtoDAsync(dst, src, nbytes, stream), "cuMemcpyDtoDAsync")

    def mem_info(self) -> tuple[int, int]:
        free, total = check(cu.cuMemGetInfo(), "cuMemGetInfo")
        return int(free), int(total)

    # -- streams, events, graphs -----------------------------------------------------------

    def stream(self):
        return check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")

    def sync(self, stream) -> None:
        check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")

    def event(self, timing: bool = False):
        flags = cu.CUevent_flags.CU_EVENT_DEFAULT if timing else cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
        return check(cu.cuEventCreate(flags), "cuEventCreate")

    def record(self, event, stream) -> None:
        check(cu.cuEventRecord(event, stream), "cuEventRecord")

    def wait_event(self, event) -> None:
        check(cu.cuEventSynchronize(event), "cuEventSynchronize")

    def elapsed_ms(self, start, end) -> float:
        return float(check(cu.cuEventElapsedTime(start, end), "cuEventElapsedTime"))

    def begin_capture(self, stream) -> None:
        mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        check(cu.cuStreamBeginCapture(stream, mode), "cuStreamBeginCapture")

    def end_capture(self, stream) -> "Graph":
        graph = check(cu.cuStreamEndCapture(stream), "cuStreamEndCapture")
        exec_ = check(cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        try:
            n_nodes = int(check(cu.cuGraphGetNodes(graph, 0), "cuGraphGetNodes")[-1])
        except (DeviceError, TypeError, ValueError, IndexError):
            n_nodes = -1  # only reported in the record; never worth failing for
        return Graph(graph, exec_, n_nodes)


class Graph:
    __slots__ = ("graph", "exec", "n_nodes")

    def __init__(self, graph, exec_, n_nodes):
        self.graph, self.exec, self.n_nodes = graph, exec_, n_nodes

    def launch(self, stream) -> None:
        check(cu.cuGraphLaunch(self.exec, stream), "cuGraphLaunch")


def ptr(value: int) -> ctypes.c_void_p:
    return ctypes.c_void_p(value)

