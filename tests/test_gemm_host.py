"""kernels/gemm.cu on the CPU: g++ compiles the prompt kernels against tests/host_emu (fibers for
threads; mma.sync, cp.async and shared-space addresses emulated in tests/host_emu/mma.cuh and mma_ops.cuh) and the
real Launcher drives them through the GPU tests' own checks (numpy products, NaN-poisoned outputs,
awkward sizes): the kernels' indexing, copy pipeline, fragment layouts, tiles and epilogues run
without a GPU. Timing, memory ordering between blocks and the device compiler are left to the GPU
tests. A subset: the emulation runs a warp's 32 lanes in turn at every mma."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import test_gpu_kernels as K
import test_gpu_moe as M
from gpu_harness import k_for
from host_emu_harness import build_host_harness

from reflex_runtime.gpu.ops import moe

SHARED = {"extern __shared__ __align__(16) unsigned char rx_smem[];": "unsigned char* rx_smem = emu::smem;"}


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    return build_host_harness(tmp_path_factory.mktemp("emu"), "gemm_host.cpp", "gemm.cu",
                              headers=("dequant.cuh", "quant.cuh", "mvs_decode.cuh"), emu_headers=("mma.cuh", "mma_ops.cuh"),
                              patches=SHARED)


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_K, Q.Q6_K, Q.F16], ids=lambda t: t.name)
@pytest.mark.parametrize("cfg", ["l", "s"])
def test_gemm(host, qtype, cfg):
    K.test_gemm_every_type_and_tile(host, qtype, cfg)


@pytest.mark.parametrize("qtype,cfg", [(Q.Q8_0, "s"), (Q.Q4_K, "l")], ids=["Q8_0-s", "Q4_K-l"])
def test_prompt_split_k(host, qtype, cfg):
    """A prompt's split-K: the partial tiles, the tile's last slice summing them in order, the
    counters left at zero (the emulation runs blocks one after another: the GPU test checks the
    ordering between blocks)."""
    K.test_gemm_prompt_split_k_sums_in_slice_order(host, qtype, cfg)


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_K], ids=lambda t: t.name)
@pytest.mark.parametrize("cfg", ["l", "s"])
def test_gate_up(host, qtype, cfg):
    K.test_gemm_gate_up_fused(host, qtype, cfg, 0)


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_K], ids=lambda t: t.name)
@pytest.mark.parametrize("tile", [moe.TILE, moe.SMALL_TILE])
def test_grouped_experts(host, qtype, tile):
    """The grouped expert kernels (f16 input and act rows) over tiles found here: one expert takes
    every token (two 32-pair tiles, or one 64-pair tile with its last 16-pair part empty)."""
    rng = np.random.default_rng([int(qtype), tile, 31])
    n_tok, n_expert, k = 37, 5, 2
    E, F = k_for(qtype, True), M._ff_for(qtype, True)
    weights, dense = M._experts(host, qtype, n_expert, E, F, rng)
    logits = rng.standard_normal((n_tok, n_expert)).astype(np.float32)
    logits[:, 3] = 10
    ids, w = M._route(logits, k, True)
    ids = ids.astype(np.int32)
    grp, order = M.host_groups(host, ids, n_expert, tile)
    M.check_expert_gemms(host, rng, qtype, n_tok, k, ids, w, grp, weights, dense, order)
