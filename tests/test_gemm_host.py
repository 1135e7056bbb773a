"""kernels/gemm.cu on the CPU: g++ compiles the prompt kernels against tests/host_emu (fibers for
threads; mma.sync, cp.async and shared-space addresses emulated in tests/host_emu/mma.cuh) and the
real Launcher drives them through the GPU tests' own checks (numpy products, NaN-poisoned outputs,
awkward sizes): the kernels' indexing, copy pipeline, fragment layouts, tiles and epilogues run
without a GPU. Timing, memory ordering between blocks and the device compiler are left to the GPU
tests. A subset: the emulation runs a warp's 32 lanes in turn at every mma."""

from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType as Q

import test_gpu_kernels as K
from host_emu_harness import build_host_harness

SHARED = {"extern __shared__ __align__(16) unsigned char rx_smem[];": "unsigned char* rx_smem = emu::smem;"}


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    return build_host_harness(tmp_path_factory.mktemp("emu"), "gemm_host.cpp", "gemm.cu",
                              headers=("dequant.cuh", "quant.cuh", "mvs_decode.cuh"), emu_headers=("mma.cuh",),
                              patches=SHARED)


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_K, Q.Q6_K, Q.F16], ids=lambda t: t.name)
@pytest.mark.parametrize("cfg", ["l", "s"])
def test_gemm(host, qtype, cfg):
    K.test_gemm_every_type_and_tile(host, qtype, cfg)


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_K], ids=lambda t: t.name)
@pytest.mark.parametrize("cfg", ["l", "s"])
def test_gate_up(host, qtype, cfg):
    K.test_gemm_gate_up_fused(host, qtype, cfg, 0)
