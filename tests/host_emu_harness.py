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
    def __init__(self, fn):
        self.fn = fn

    def launch(self, grid, block, args, stream, shmem=0, pdl=False):
        gx, gy, gz = grid if isinstance(grid, tuple) else (grid, 1, 1)
        self.fn(gx, gy, gz, block, *args)


class _HostDevice:
    sm_count, cc = 132, (9, 0)  # an H200's, for the launcher's choices
    max_shared, smem_per_sm = 232448, 233472  # opt-in shared memory per block, and per SM

    def __init__(self, lib):
        self.lib = lib

    def kernel(self, name):
        return _HostKernel(getattr(self.lib, "emu_" + name.removeprefix("reflex_")))


class HostHarness:
    """GpuHarness's interface over host memory: pointers are numpy arrays' addresses."""

    def __init__(self, lib):
        from reflex_runtime.gpu.launch import Launcher

        self.launch = Launcher(_HostDevice(lib), None)
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


def build_host_harness(tmp_dir, entry_points: str, kernel_file: str) -> HostHarness:
    """Compile tests/host_emu/<entry_points> (which #includes kernels/<kernel_file>) into a
    shared library in tmp_dir; skips when g++ is missing."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not installed")
    for src in (os.path.join(ROOT, "tests", "host_emu", "common.cuh"),
                os.path.join(ROOT, "tests", "host_emu", entry_points),
                os.path.join(ROOT, "kernels", kernel_file)):
        shutil.copy(src, tmp_dir)  # the kernel's #include "common.cuh" then finds the host stand-in
    lib = os.path.join(tmp_dir, "lib" + entry_points.removesuffix(".cpp") + ".so")
    subprocess.run([gxx, "-std=c++20", "-O1", "-pthread", "-shared", "-fPIC", "-o", lib,
                    os.path.join(tmp_dir, entry_points)], check=True)
    return HostHarness(ctypes.CDLL(lib))
