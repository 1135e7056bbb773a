"""kernels/attn_decode.cu and attn_stream.cu on the CPU (tests/host_emu_harness.py): the decode
attention's tiled path, its short-context path (kernels/attn_short.cuh) and the streaming kernel
through the GPU tests' own checks (float64
references, NaN-poisoned outputs and partials, counters left at zero) with the real Launcher's
grids and argument packs: every index, barrier, shuffle and the slices' merge run without a GPU.
Timing, memory ordering between blocks and the device compiler are left to the GPU tests."""

from __future__ import annotations

import pytest

import test_gpu_batch as B
import test_gpu_kernels as K
import test_gpu_paged as P
from host_emu_harness import build_host_harness

# the block's named barrier over its 128 threads: every thread of an emulated block
BARRIER = {"attn_decode.cuh": {'asm volatile("bar.sync 1, %0;" ::"n"(ATD_THREADS) : "memory");': "__syncthreads();"}}
SHORT = [c for c in K.DECODE_ATTN_CASES if c.startswith("short_")] + ["qwen3_ctx1", "qwen3_ctx33_one_slice",
                                                                       "hd96_one_key_per_slice", "mha_hd64_odd_keys",
                                                                       "hd64_values128_ctx300"]
SHORT_ROPE = [c for c in K.FUSED_ROPE_CASES if c.startswith("short_")] + ["first_token", "empty_last_slice",
                                                                          "partial_pairwise_factors"]


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    return build_host_harness(tmp_path_factory.mktemp("emu"), "attn_decode_host.cpp", "attn_decode.cu",
                              headers=("attn_stream.cu", "attn_short.cuh", "attn_decode.cuh", "attention.cuh",
                                       "attn_decode_args.cuh"),
                              emu_headers=("stage.cuh",), header_patches=BARRIER)


@pytest.fixture
def knobs(host):
    L = host.launch
    saved = dict(attn_min_keys=L.attn_min_keys, attn_head_groups=L.attn_head_groups,
                 attn_short_keys=L.attn_short_keys, attn_blocks_per_sm=L.attn_blocks_per_sm,
                 attn_stream=L.attn_stream, attn_stream_blocks_per_sm=L.attn_stream_blocks_per_sm)
    yield L
    for k, v in saved.items():
        setattr(L, k, v)


@pytest.mark.parametrize("case", SHORT)
@pytest.mark.parametrize("head_groups", [1, 4])
@pytest.mark.parametrize("short", [0, 64])
def test_attention_decode(host, knobs, case, head_groups, short):
    K.test_attention_decode(host, knobs, case, head_groups, short, False)


@pytest.mark.parametrize("case", SHORT_ROPE)
@pytest.mark.parametrize("head_groups", [1, 2])
@pytest.mark.parametrize("short", [0, 64])
def test_attention_decode_with_fused_rope_and_store(host, knobs, case, head_groups, short):
    K.test_attention_decode_with_fused_rope_and_store(host, knobs, case, head_groups, short, False)


# the streaming kernel: slices of a few groups per warp (small min_keys), many slices and their merge,
# empty trailing slices, windows, softcap, the short path inside it; cases past its heads fall back
STREAM = ["qwen3_0.6b_ctx256", "qwen3_ctx1", "qwen3_ctx33_one_slice", "moe_gqa8_empty_runs", "gqa16_hd32_softcap",
          "mha_hd64_odd_keys", "hd96_one_key_per_slice", "short_smollm_hd64_g3_ctx64", "short_hd128_values64",
          "hd64_values128_ctx300", "gemma_window_longer_than_context", "long_slices_ctx600",
          "long_slices_window_hd64", "hd32_g2_ctx200", "softcap_g4_hd64_ctx150"]
STREAM_ROPE = ["qwen3_neox_norms", "partial_pairwise_factors", "first_token", "empty_last_slice",
               "new_key_in_second_tile", "new_key_in_eighth_tile", "short_smollm_hd64_g3_ctx30"]


@pytest.mark.parametrize("case", STREAM)
@pytest.mark.parametrize("head_groups,short", [(1, 0), (4, 0), (4, 64)])
def test_attention_stream(host, knobs, case, head_groups, short):
    K.test_attention_decode(host, knobs, case, head_groups, short, True)


@pytest.mark.parametrize("case", STREAM_ROPE)
@pytest.mark.parametrize("head_groups,short", [(1, 0), (2, 0), (2, 64)])
def test_attention_stream_with_fused_rope_and_store(host, knobs, case, head_groups, short):
    K.test_attention_decode_with_fused_rope_and_store(host, knobs, case, head_groups, short, True)


@pytest.mark.parametrize("case", ["short_rows", "gemma_window_rows4", "hd96_rows2"])
@pytest.mark.parametrize("prefetch,head_groups,short", [(True, 1, 0), (False, 1, 64), (True, 2, 64)])
def test_decode_attention_rows(host, knobs, case, prefetch, head_groups, short):
    B.test_decode_attention_rows(host, knobs, case, prefetch, head_groups, short, False)


def test_decode_attention_rows_one_slice_each(host, knobs):
    B.test_decode_attention_rows_one_slice_each(host, knobs)


@pytest.mark.parametrize("case", ["short_rows", "qwen3_rows5"])
@pytest.mark.parametrize("stream", [False, True])
def test_decode_attention_rows_stream(host, knobs, case, stream):
    B.test_decode_attention_rows(host, knobs, case, True, 2, 0, stream)


@pytest.mark.parametrize("kernel", ["decode_prefetch", "decode_short", "decode_stream"])
def test_decode_rows_paged(host, knobs, kernel):
    P.test_decode_rows_paged(host, knobs, "short_rows", kernel)


@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("n_vis,short,stream", [(20, 64, False), (300, 0, True)])
def test_fused_rope_decode_paged(host, knobs, prefetch, n_vis, short, stream):
    P.test_fused_rope_decode_paged(host, knobs, prefetch, n_vis, short, stream)
