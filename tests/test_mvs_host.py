"""kernels/mvs.cu's staged one-token matrix kernels on the CPU (tests/host_emu_harness.py), with
kernels/attn_decode.cu in the same library: the GPU tests' own checks (float64 references, poisoned
outputs) through the real Launcher's plans and argument packs, so the integer-dot decoders, the
staging of rows at any 2-byte alignment and the output projection's merge of the decode attention's
slices (reflex_mvs_merge_*) run without a GPU. A cp.async copy lands only when its thread waits
for it, and each block's shared memory starts as NaN (tests/host_emu/stage.cuh). Timing and the
device compiler are left to the GPU tests."""

from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType as Q

import test_gpu_kernels as K
from host_emu_harness import build_host_harness

HEADERS = ("mvs.cuh", "matvec.cuh", "attn_plan.cuh", "mvs_decode.cuh", "quant.cuh", "dequant.cuh", "state.cuh",
           "stage_run.cuh", "attn_decode.cu", "attn_decode.cuh", "attention.cuh", "attn_decode_args.cuh")
# the attention block's named barrier over its 128 threads: every thread of an emulated block
BARRIER = {"attn_decode.cuh": {'asm volatile("bar.sync 1, %0;" ::"n"(ATD_THREADS) : "memory");': "__syncthreads();"}}


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    return build_host_harness(tmp_path_factory.mktemp("emu"), "mvs_host.cpp", "mvs.cu", headers=HEADERS,
                              emu_headers=("stage.cuh", "mma_ops.cuh", "attn_decode_entry.cuh"), header_patches=BARRIER)


@pytest.fixture
def knobs(host):
    L = host.launch
    saved = {k: getattr(L, k) for k in ("attn_min_keys", "attn_head_groups", "mvs_budget", "mvs_blocks_per_sm",
                                        "mvs_head_stream", "post_fold", "staged")}
    yield L
    for k, v in saved.items():
        setattr(L, k, v)


@pytest.mark.parametrize("case", K.DEFER_CASES)
@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_K], ids=lambda t: t.name)
def test_output_projection_merges_the_attention_slices(host, knobs, case, qtype):
    K.test_output_projection_merges_the_attention_slices(host, knobs, case, qtype)


@pytest.mark.parametrize("qtype", [Q.F16, Q.Q8_0, Q.Q4_0, Q.Q4_K, Q.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("rows,k", [(37, None), (301, 2048)])
@pytest.mark.parametrize("fused_norm", [False, True])
def test_staged_matvec_one_token(host, knobs, qtype, rows, k, fused_norm):
    K.test_staged_matvec_one_token(host, knobs, qtype, rows, k, fused_norm)


@pytest.mark.parametrize("qtype", [Q.F16, Q.Q8_0, Q.Q4_K, Q.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("act,fused_norm,k", [(0, True, None), (1, False, None), (0, True, 3072)])
def test_staged_glu_one_token(host, knobs, qtype, act, fused_norm, k):
    K.test_staged_glu_one_token(host, knobs, qtype, act, fused_norm, k)


@pytest.mark.parametrize("types", [(Q.Q8_0,) * 3, (Q.Q4_K, Q.Q4_K, Q.Q6_K)], ids=lambda ts: "-".join(t.name for t in ts))
def test_post_norm_folded_into_segments_and_glu(host, knobs, types):
    K.test_post_norm_folded_into_segments_and_glu(host, knobs, types, 2304)


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_K], ids=lambda t: t.name)
@pytest.mark.parametrize("stream", [0, 2])
def test_staged_lm_head_with_fused_argmax(host, knobs, qtype, stream):
    K.test_staged_lm_head_with_fused_argmax(host, knobs, qtype, stream)


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_K, Q.Q6_K], ids=lambda t: t.name)
def test_staged_products_keep_a_non_finite_input_visible(host, qtype):
    K.test_staged_products_keep_a_non_finite_input_visible(host, qtype, float("nan"))
