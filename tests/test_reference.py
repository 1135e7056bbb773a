"""The numpy reference against `transformers` on tiny random models converted by llama.cpp's
own convert_hf_to_gguf.py (scripts/make_fixtures.py), and the forward contract of
docs/INTERNALS.md: cache, positions, masks.

Relative error of a logits row: max_i |ref_i - hf_i| / max_i |hf_i|, checked at EVERY position.
"""

from __future__ import annotations

import numpy as np
import pytest
from reference_checks import (TOL, assert_copy_is_independent, assert_greedy_matches_generate,
                              assert_prefill_equals_steps, hf_logits, prompt, rel_err, tree_6_5_4)

from reflex_runtime.errors import RequestError

ARCHS = ["qwen3", "gemma3"]
QUANT_TYPES = ["f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "q4_k_m"]
# ggml types each file must contain (so a test cannot pass on a file that is secretly f32)
EXPECTED_TYPES = {
    "f16": {"F16"}, "bf16": {"BF16"}, "q8_0": {"Q8_0"}, "q4_0": {"Q4_0"}, "q4_1": {"Q4_1"}, "q5_0": {"Q5_0"}, "q5_1": {"Q5_1"},
    "q4_k": {"Q4_K"}, "q5_k": {"Q5_K"}, "q6_k": {"Q6_K"}, "q4_k_m": {"Q4_K", "Q6_K"},
}
MIN_CORR = {"f16": 0.9999, "bf16": 0.999, "q8_0": 0.999, "q6_k": 0.99, "q5_0": 0.94, "q5_1": 0.94, "q5_k": 0.94,
            "q4_0": 0.8, "q4_1": 0.8, "q4_k": 0.8, "q4_k_m": 0.8}


# -- configuration ------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_config_matches_transformers(arch, reference_for, hf_for):
    c = reference_for(arch).config
    h = hf_for(arch).config
    assert (c.n_layers, c.n_embd, c.n_ff) == (h.num_hidden_layers, h.hidden_size, h.intermediate_size)
    assert (c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v) == (
        h.num_attention_heads, h.num_key_value_heads, h.head_dim, h.head_dim)
    assert c.vocab_size == h.vocab_size
    assert c.rms_eps == pytest.approx(h.rms_norm_eps, rel=1e-6)
    assert c.tied_embeddings == h.tie_word_embeddings
    rope = h.rope_parameters
    if arch == "gemma3":
        assert c.rope_theta == rope["full_attention"]["rope_theta"]
        assert c.extra["rope_theta_local"] == rope["sliding_attention"]["rope_theta"]
        assert c.extra["sliding_window"] == h.sliding_window
        assert list(c.extra["local_layers"]) == [t == "sliding_attention" for t in h.layer_types]
        assert any(c.extra["local_layers"]) and not all(c.extra["local_layers"])
        assert c.extra["query_scale"] == pytest.approx(h.query_pre_attn_scalar ** -0.5)
        assert c.extra["final_logit_softcap"] is None
    else:
        assert c.rope_theta == rope["rope_theta"]


# -- logits against transformers -----------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_f32_logits_match_transformers(arch, reference_for, hf_for):
    ref = reference_for(arch)
    ids = prompt(24, vocab=ref.config.vocab_size)  # gemma3's window is 8: the prompt crosses it
    got = ref.forward(ids, ref.new_cache(32))
    want = hf_logits(hf_for(arch), ids)
    assert got.dtype == np.float32 and got.shape == want.shape
    err = rel_err(got, want)
    assert err.max() < TOL, f"{arch}: relative error per position {err}"


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_decode_matches_generate(arch, reference_for, hf_for):
    ref = reference_for(arch)
    assert_greedy_matches_generate(ref, hf_for(arch), prompt(12, seed=3, vocab=ref.config.vocab_size), label=arch)


@pytest.mark.parametrize("outtype", QUANT_TYPES)
@pytest.mark.parametrize("arch", ARCHS)
def test_quantized_file_matches_dequantized_transformers(arch, outtype, fixture_paths, reference_for, hf_for):
    from fixtures import hf_model_from_gguf

    from reflex_runtime.modelfile.ggml_types import GGML_TYPES
    from reflex_runtime.families import load_reference

    fx = fixture_paths(arch, outtype)
    ref = load_reference(fx.gguf)
    types = {GGML_TYPES[t.ggml_type].name for t in ref.gguf.tensors.values()}
    assert EXPECTED_TYPES[outtype] <= types, f"{fx.gguf} has {types}"
    ids = prompt(16, seed=11, vocab=ref.config.vocab_size)
    got = ref.forward(ids, ref.new_cache(16))
    want = hf_logits(hf_model_from_gguf(fx.gguf, fx.hf_dir), ids)
    err = rel_err(got, want)
    assert err.max() < TOL, f"{arch} {outtype}: relative error per position {err}"
    # And the quantized model still tracks the f32 one (catches a quantizer that writes garbage
    # both sides would read the same way). Random models amplify weight noise, so the bound is a
    # per-position correlation, by bits per weight (measured: 4-bit >= 0.86, 5-bit >= 0.96).
    full = reference_for(arch).forward(ids, reference_for(arch).new_cache(16))
    corr = min(np.corrcoef(got[i], full[i])[0, 1] for i in range(len(ids)))
    assert corr > MIN_CORR[outtype], f"{arch} {outtype}: correlation with f32 logits {corr}"


def test_untied_output_matches_transformers(fixture_paths, reference_for, hf_for):
    ref = reference_for("qwen3", tie_word_embeddings=False, num_hidden_layers=1)
    assert "output.weight" in ref.gguf.tensors and not ref.config.tied_embeddings
    ids = prompt(10, vocab=ref.config.vocab_size)
    err = rel_err(ref.forward(ids, ref.new_cache(10)), hf_logits(hf_for("qwen3", tie_word_embeddings=False, num_hidden_layers=1), ids))
    assert err.max() < TOL


def test_gemma3_final_softcap_matches_transformers(reference_for, hf_for):
    ref = reference_for("gemma3", final_logit_softcapping=0.5)
    assert ref.config.extra["final_logit_softcap"] == pytest.approx(0.5)
    ids = prompt(12, vocab=ref.config.vocab_size)
    got = ref.forward(ids, ref.new_cache(12))
    assert np.abs(got).max() < 0.5
    assert rel_err(got, hf_logits(hf_for("gemma3", final_logit_softcapping=0.5), ids)).max() < TOL


# -- the forward contract ----------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_equals_token_by_token(arch, reference_for):
    ref = reference_for(arch)
    ids = prompt(20, seed=5, vocab=ref.config.vocab_size)
    assert_prefill_equals_steps(ref, ids)  # chunked prefill (7 + 13) on top of a cache, too


@pytest.mark.parametrize("arch", ARCHS)
def test_tree_mask_branches_equal_separate_runs(arch, reference_for):
    ref = reference_for(arch)
    ids = prompt(15, seed=9, vocab=ref.config.vocab_size)
    p, a, b = ids[:6], ids[6:11], ids[11:]
    sep_a = ref.forward(np.r_[p, a], ref.new_cache(11))
    sep_b = ref.forward(np.r_[p, b], ref.new_cache(10))

    # prefix in the cache, both branches in one call
    cache = ref.new_cache(15)
    ref.forward(p, cache)
    pos = np.r_[6 + np.arange(5), 6 + np.arange(4)]
    mask = np.zeros((9, 9), dtype=bool)
    mask[:5, :5] = np.tril(np.ones((5, 5), dtype=bool))
    mask[5:, 5:] = np.tril(np.ones((4, 4), dtype=bool))
    tree = ref.forward(np.r_[a, b], cache, positions=pos, mask=mask)
    assert cache.length == 15
    assert rel_err(tree[:5], sep_a[6:]).max() < 1e-5
    assert rel_err(tree[5:], sep_b[6:]).max() < 1e-5

    # everything in one call on an empty cache (how system1 scores candidates)
    n = 15
    pos, mask = tree_6_5_4()
    one = ref.forward(ids, ref.new_cache(n), positions=pos, mask=mask)
    assert rel_err(one[:11], sep_a).max() < 1e-5
    assert rel_err(one[11:], sep_b[6:]).max() < 1e-5


@pytest.mark.parametrize("arch", ARCHS)
def test_cache_copy_and_truncate(arch, reference_for):
    ref = reference_for(arch)
    ids = prompt(14, seed=13, vocab=ref.config.vocab_size)
    cache = assert_copy_is_independent(ref, ids)
    p, b = ids[:6], ids[10:]
    sep_b = ref.forward(np.r_[p, b], ref.new_cache(10))

    cache.truncate(6)
    assert cache.length == 6
    assert rel_err(ref.forward(b, cache), sep_b[6:]).max() < 1e-5
    with pytest.raises(RequestError):
        cache.truncate(11)


def test_forward_rejects_bad_input(reference_for):
    ref = reference_for("gemma3")
    with pytest.raises(RequestError):
        ref.forward([ref.config.vocab_size], ref.new_cache(4))
    cache = ref.new_cache(4)
    ref.forward([5, 6, 7], cache)
    with pytest.raises(RequestError):
        ref.forward([5, 6], cache)  # 3 + 2 > 4
    assert cache.length == 3
    with pytest.raises(RequestError):
        ref.forward([5, 6], ref.new_cache(4), mask=np.ones((3, 3), dtype=bool))


def test_unsupported_architecture_is_named(reference_for):
    from dataclasses import replace

    from reflex_runtime.errors import UnsupportedModelError
    from reflex_runtime.families import load_reference

    ref = reference_for("gemma3")
    with pytest.raises(UnsupportedModelError, match="mamba"):
        load_reference(ref.gguf, replace(ref.config, arch="mamba"))
