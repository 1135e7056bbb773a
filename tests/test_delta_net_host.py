"""kernels/delta_net.cu on the CPU: g++ compiles the kernels against tests/host_emu/common.cuh
(every GPU thread a host thread, __syncthreads a barrier, warp shuffles through an exchange
buffer) and the real Launcher drives them (its launch shapes and argument packs), through a
subset of the GPU tests' own checks (tests/test_gpu_qwen35.py: numpy reference, NaN-poisoned
outputs and stale states). This runs the kernels' indexing, barriers and shuffles without a GPU;
timing, memory ordering between blocks and the device compiler are left to the GPU tests.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess

import numpy as np
import pytest

import test_gpu_qwen35 as G

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


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not installed")
    d = tmp_path_factory.mktemp("emu")
    for src in (os.path.join(ROOT, "tests", "host_emu", "common.cuh"),
                os.path.join(ROOT, "tests", "host_emu", "delta_net_host.cpp"),
                os.path.join(ROOT, "kernels", "delta_net.cu")):
        shutil.copy(src, d)  # the kernel's #include "common.cuh" then finds the host stand-in
    lib = d / "libdn.so"
    subprocess.run([gxx, "-std=c++20", "-O1", "-pthread", "-shared", "-fPIC", "-o", str(lib),
                    str(d / "delta_net_host.cpp")], check=True)
    return HostHarness(ctypes.CDLL(str(lib)))


SHAPES = [(2, 6, 40, 24), (1, 1, 128, 128)]  # odd sizes and tiles; full 128 tiles (fewer blocks: it is slow here)
BATCHES = [([1, 1, 1], [0, 9, 3]), ([33, 1, 40], [12, 0, 4])]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("lengths,first_pos", BATCHES, ids=str)
def test_conv(host, shape, lengths, first_pos):
    G.test_conv_silu_l2norm_and_state(host, shape, lengths, first_pos, 4)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("lengths,first_pos", BATCHES, ids=str)
def test_recurrent(host, shape, lengths, first_pos):
    G.test_delta_rule_recurrent_with_gated_norm(host, shape, lengths, first_pos)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("lengths,first_pos", BATCHES, ids=str)
def test_chunked(host, shape, lengths, first_pos):
    G.test_delta_rule_chunked_matches_both_reference_forms(host, shape, lengths, first_pos)


def test_two_passes_then_decode(host):
    G.test_prompt_in_two_passes_equals_one_and_decode_continues_it(host, 45, nk=1, nv=1)
