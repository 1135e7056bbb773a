"""kernels/delta_net.cu on the CPU: g++ compiles the kernels against tests/host_emu/common.cuh
(every GPU thread a host thread, __syncthreads a barrier, warp shuffles through an exchange
buffer) and the real Launcher drives them (its launch shapes and argument packs), through a
subset of the GPU tests' own checks (tests/test_gpu_qwen35.py: numpy reference, NaN-poisoned
outputs and stale states). This runs the kernels' indexing, barriers and shuffles without a GPU;
timing, memory ordering between blocks and the device compiler are left to the GPU tests.
"""

from __future__ import annotations

import pytest

import test_gpu_qwen35 as G
from host_emu_harness import build_host_harness


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    return build_host_harness(tmp_path_factory.mktemp("emu"), "delta_net_host.cpp", "delta_net.cu", patches=SHARED)


# the chunked kernel's dynamic shared memory: the stand-in's buffer (delta_net_host.cpp)
SHARED = {"extern __shared__ __align__(16) unsigned char rx_smem[];": "unsigned char* rx_smem = emu_dyn_smem;"}


# odd sizes and tiles (a head size not a multiple of 4); full 128 tiles (fewer blocks: it is slow here)
SHAPES = [(2, 6, 40, 24), (1, 2, 30, 20), (1, 1, 128, 128)]
BATCHES = [([1, 1, 1], [0, 9, 3]), ([33, 1, 40], [12, 0, 4])]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("lengths,first_pos", BATCHES, ids=str)
@pytest.mark.parametrize("slotted", [False, True], ids=["", "slots"])
def test_conv(host, shape, lengths, first_pos, slotted):
    G.test_conv_silu_l2norm_and_state(host, shape, lengths, first_pos, 4, slotted)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("lengths,first_pos", BATCHES, ids=str)
@pytest.mark.parametrize("slotted", [False, True], ids=["", "slots"])
def test_recurrent(host, shape, lengths, first_pos, slotted):
    G.test_delta_rule_recurrent_with_gated_norm(host, shape, lengths, first_pos, slotted)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("lengths,first_pos", BATCHES + [G.MANY], ids=str)
def test_chunked(host, shape, lengths, first_pos):
    if len(lengths) > 3 and shape[2] == 128:
        pytest.skip("many sequences at the full head size: the small shapes cover the groups, faster here")
    G.test_delta_rule_chunked_matches_both_reference_forms(host, shape, lengths, first_pos, slotted=len(lengths) > 1)


def test_two_passes_then_decode(host):
    G.test_prompt_in_two_passes_equals_one_and_decode_continues_it(host, 45, nk=1, nv=1)
