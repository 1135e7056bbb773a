"""kernels/attn_decode.cu on the CPU (tests/host_emu_harness.py): the decode attention through the
GPU tests' own checks (float64 references, NaN-poisoned outputs and partials, counters left at zero)
with the real Launcher's grids and argument packs: every index, barrier, shuffle and the slices'
merge run without a GPU. In the emulation a cp.async copy lands only when the issuing thread waits
for it, and each block's shared memory starts as NaN (stage.cuh). Timing, memory ordering between
blocks and the device compiler are left to the GPU tests."""

from __future__ import annotations

import pytest

import test_gpu_batch as B
import test_gpu_kernels as K
import test_gpu_paged as P
from host_emu_harness import build_host_harness

# the block's named barrier over its 128 threads: every thread of an emulated block
BARRIER = {"attn_decode.cuh": {'asm volatile("bar.sync 1, %0;" ::"n"(ATD_THREADS) : "memory");': "__syncthreads();"}}
# short contexts, one key a slice, odd key counts, values wider than keys, many tiles a slice, windows
CASES = [c for c in K.DECODE_ATTN_CASES if c.startswith("short_")] + [
    "qwen3_0.6b_ctx256", "qwen3_ctx1", "qwen3_ctx33_one_slice", "moe_gqa8_empty_runs", "gqa16_hd32_softcap",
    "hd96_one_key_per_slice", "mha_hd64_odd_keys", "hd64_values128_ctx300", "gemma_window_longer_than_context",
    "long_slices_ctx600", "long_slices_window_hd64", "hd32_g2_ctx200", "softcap_g4_hd64_ctx150", "gqa8_hd32_ctx300"]
ROPE = [c for c in K.FUSED_ROPE_CASES if c.startswith("short_")] + [
    "qwen3_neox_norms", "first_token", "empty_last_slice", "partial_pairwise_factors", "new_key_in_second_tile",
    "new_key_in_eighth_tile"]


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    return build_host_harness(tmp_path_factory.mktemp("emu"), "attn_decode_host.cpp", "attn_decode.cu",
                              headers=("attn_decode.cuh", "attention.cuh", "attn_decode_args.cuh", "attn_plan.cuh"),
                              emu_headers=("stage.cuh", "mma_ops.cuh", "attn_decode_entry.cuh"), header_patches=BARRIER)


@pytest.fixture
def knobs(host):
    L = host.launch
    saved = dict(attn_min_keys=L.attn_min_keys, attn_head_groups=L.attn_head_groups,
                 attn_blocks_per_sm=L.attn_blocks_per_sm, attn_group_kernels=L.attn_group_kernels, attn_tc=L.attn_tc,
                 attn_tc_min_keys=L.attn_tc_min_keys)
    yield L
    for k, v in saved.items():
        setattr(L, k, v)


# kernels: "tc", reflex_attn_decode_t2 / _t4 / _t8 where they hold the heads (REFLEX_ATTN_TC=1), every
# slice on tensor cores (REFLEX_ATTN_TC_MIN_KEYS=0), else the tile loop's narrowest; "tc64", the same with
# the default threshold (slices of < 64 keys through their tiles: both paths in one launch); "group", the
# tile loop's reflex_attn_decode_g2 / _g4 for groups of at most 2 / 4 query heads (the default); "general",
# reflex_attn_decode for all (REFLEX_ATTN_GROUP_KERNELS=0)
KERNELS = ["tc", "tc64", "group", "general"]


def _use(L, kernels):
    L.attn_tc = kernels.startswith("tc")
    L.attn_tc_min_keys = 64 if kernels == "tc64" else 0
    L.attn_group_kernels = kernels != "general"


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("head_groups", [1, 4])
@pytest.mark.parametrize("kernels", KERNELS)
def test_attention_decode(host, knobs, case, head_groups, kernels):
    _use(knobs, kernels)
    K.test_attention_decode(host, knobs, case, head_groups)


@pytest.mark.parametrize("case", ROPE)
@pytest.mark.parametrize("head_groups", [1, 2])
@pytest.mark.parametrize("kernels", KERNELS)
def test_attention_decode_with_fused_rope_and_store(host, knobs, case, head_groups, kernels):
    _use(knobs, kernels)
    K.test_attention_decode_with_fused_rope_and_store(host, knobs, case, head_groups)


@pytest.mark.parametrize("case", ["short_rows", "gemma_window_rows4", "hd96_rows2", "qwen3_rows5"])
@pytest.mark.parametrize("prefetch,head_groups", [(False, 1), (True, 1), (True, 2)])
@pytest.mark.parametrize("kernels", ["tc", "group"])
def test_decode_attention_rows(host, knobs, case, prefetch, head_groups, kernels):
    _use(knobs, kernels)
    B.test_decode_attention_rows(host, knobs, case, prefetch, head_groups)


@pytest.mark.parametrize("kernels", ["tc", "group"])
def test_decode_attention_rows_one_slice_each(host, knobs, kernels):
    _use(knobs, kernels)
    B.test_decode_attention_rows_one_slice_each(host, knobs)


@pytest.mark.parametrize("kernel", ["decode", "decode_prefetch"])
@pytest.mark.parametrize("kernels", ["tc", "group"])
def test_decode_rows_paged(host, knobs, kernel, kernels):
    _use(knobs, kernels)
    P.test_decode_rows_paged(host, knobs, "short_rows", kernel)


@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("n_vis", [20, 300])
@pytest.mark.parametrize("kernels", ["tc", "group"])
def test_fused_rope_decode_paged(host, knobs, prefetch, n_vis, kernels):
    _use(knobs, kernels)
    P.test_fused_rope_decode_paged(host, knobs, prefetch, n_vis)


@pytest.mark.parametrize("case", K.DEFER_CASES)
@pytest.mark.parametrize("head_groups", [1, 4])
@pytest.mark.parametrize("kernels", ["tc", "group"])
def test_attention_decode_leaves_a_few_slices_unmerged(host, knobs, case, head_groups, kernels):
    _use(knobs, kernels)
    K.test_attention_decode_leaves_a_few_slices_unmerged(host, knobs, case, head_groups)
