"""Run kernels/*.cu on the CPU: g++ compiles a kernel file against tests/host_emu/common.cuh
(every GPU thread a fiber, __syncthreads a barrier, warp shuffles through an exchange buffer)
and the real Launcher drives it (its launch shapes and argument packs). Kernels' indexing,
barriers and shuffles run without a GPU; timing, memory ordering between blocks and the device
compiler are left to the GPU tests."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _HostKernel:
    def __init__(self, fn, name, lib=None):
        self.fn, self.name = fn, name
        # stage.cuh's bound on the launch's dynamic shared memory, where the harness includes it
        self.set_dyn = getattr(lib, "emu_set_dyn_bytes", None) if lib is not None else None
        if self.set_dyn is not None:
            self.set_dyn.argtypes = [ctypes.c_size_t]

    def launch(self, grid, block, args, stream, shmem=0, pdl=False, carveout=None):
        gx, gy, gz = grid if isinstance(grid, tuple) else (grid, 1, 1)
        if self.set_dyn is not None:
            self.set_dyn(shmem)
        self.fn(gx, gy, gz, block, *args)

    def blocks_per_sm(self, block, shmem):  # the driver's occupancy query, by threads and shared memory only
        return min(2048 // block, (_HostDevice.smem_per_sm - 1024) // (shmem + 1024))


class _HostDevice:
    sm_count, cc = 132, (9, 0)  # an H200's, for the launcher's choices
    max_shared, smem_per_sm = 232448, 233472  # opt-in shared memory per block, and per SM

    def __init__(self, lib):
        self.lib = lib

    def kernel(self, name):
        return _HostKernel(getattr(self.lib, "emu_" + name.removeprefix("reflex_")), name, self.lib)


class HostHarness:
    """GpuHarness's interface over host memory: pointers are numpy arrays' addresses."""

    def __init__(self, lib):
        from reflex_runtime.gpu.launch import Launcher

        self.dev = _HostDevice(lib)
        self.launch = Launcher(self.dev, None)
        self._arrays: dict[int, np.ndarray] = {}

    def put(self, arr) -> int:
        a = np.array(arr, copy=True, order="C")
        self._arrays[a.ctypes.data] = a
        return a.ctypes.data

    def poisoned(self, shape, dtype=np.float32) -> int:
        return self.put(np.full(shape, np.nan if np.dtype(dtype).kind == "f" else -7, dtype=dtype))

    def get(self, ptr, shape, dtype=np.float32):
        count = int(np.prod(shape))
        return self._arrays[ptr].view(dtype).reshape(-1)[:count].reshape(shape).copy()

    def sync(self):
        pass


def cuda_include() -> str | None:
    """The CUDA toolkit's include folder (cuda_fp16.h: g++ compiles its host half type), or None."""
    import glob

    nvcc = shutil.which("nvcc")
    cands = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"), reverse=True)]
    if nvcc:
        cands.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    return next((os.path.join(d, "include") for d in cands
                 if d and os.path.isfile(os.path.join(d, "include", "cuda_fp16.h"))), None)


def build_host_harness(tmp_dir, entry_points: str, kernel_file: str, headers=(), emu_headers=(),
                       patches: dict | None = None, header_patches: dict | None = None) -> HostHarness:
    """Compile tests/host_emu/<entry_points> (which #includes kernels/<kernel_file>) into a
    shared library in tmp_dir; skips when g++ is missing. headers: more kernels/ files the kernel
    includes as they are; emu_headers: tests/host_emu stand-ins for kernels/ headers of the same
    name; patches: {kernels/ line: its host form} (a declaration g++ cannot take), header_patches
    the same for headers ({header: {line: host form}}). With headers or
    stand-ins, or an entry file that includes cuda_fp16.h, the CUDA toolkit's include folder is on
    the path (cuda_fp16.h's host half)."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not installed")
    for src in (os.path.join(ROOT, "tests", "host_emu", "common.cuh"),
                os.path.join(ROOT, "tests", "host_emu", entry_points),
                *(os.path.join(ROOT, "tests", "host_emu", h) for h in emu_headers),
                *(os.path.join(ROOT, "kernels", h) for h in (kernel_file, *headers))):
        shutil.copy(src, tmp_dir)  # the kernel's #include "common.cuh" then finds the host stand-in
    for name, edits in [(kernel_file, patches or {}), *(header_patches or {}).items()]:
        path = os.path.join(tmp_dir, name)
        text = open(path).read()
        for old, new in edits.items():
            assert old in text, f"{name} no longer has {old!r}"
            text = text.replace(old, new)
        open(path, "w").write(text)
    flags = []
    if headers or emu_headers or "<cuda_fp16.h>" in open(os.path.join(tmp_dir, entry_points)).read():
        inc = cuda_include()
        if inc is None:
            pytest.skip("no CUDA toolkit include folder (cuda_fp16.h)")
        flags = ["-I", inc]
    lib = os.path.join(tmp_dir, "lib" + entry_points.removesuffix(".cpp") + ".so")
    subprocess.run([gxx, "-std=c++20", "-O1", "-pthread", "-shared", "-fPIC", *flags, "-o", lib,
                    os.path.join(tmp_dir, entry_points)], check=True)
    return HostHarness(ctypes.CDLL(lib))
