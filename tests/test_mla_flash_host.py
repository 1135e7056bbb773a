"""kernels/mla_flash.cu on the CPU: g++ compiles the prompt latent-attention kernel against
tests/host_emu (fibers for threads; mma.sync, ldmatrix and cp.async emulated in
tests/host_emu/mma.cuh) and the real Launcher drives it through test_gpu_deepseek2.py's own
checks (numpy, NaN-poisoned outputs and NaN cache slots, trees, a paged cache). Timing and the
device compiler are left to the GPU tests."""

from __future__ import annotations

import pytest

import test_gpu_deepseek2 as D
from host_emu_harness import build_host_harness

SHARED = {"extern __shared__ __align__(16) unsigned char rx_smem[];": "unsigned char* rx_smem = emu::smem;"}


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    return build_host_harness(tmp_path_factory.mktemp("emu"), "mla_flash_host.cpp", "mla_flash.cu",
                              emu_headers=("mma.cuh", "mma_ops.cuh"), patches=SHARED)


@pytest.mark.parametrize("case", list(D.FLASH_CASES))
def test_mla_flash(host, case):
    D.test_mla_flash_attention(host, case)
