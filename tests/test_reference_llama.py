"""The llama family's numpy reference against `transformers`: tiny random LlamaForCausalLM models
converted by llama.cpp's own converter (scripts/fixtures/llama.py: GQA, untied and tied LM heads,
Llama 3.1's rope scaling through rope_freqs, linear rope scaling) in f32, f16, Q8_0, Q4_1, Q5_1
and Q4_K_M, and the real SmolLM2-135M-Instruct Q4_1 against transformers reading the same GGUF.

Relative error of a logits row: max_i |ref_i - hf_i| / max_i |hf_i|, checked at EVERY position.
"""

from __future__ import annotations

import numpy as np
import pytest
from reference_checks import (TOL, assert_copy_is_independent, assert_greedy_matches_generate,
                              assert_prefill_equals_steps, hf_logits, prompt, rel_err, tree_6_5_4)

from reflex_runtime.errors import ModelFileError, UnsupportedModelError

LLAMA3 = {"rope_llama3": 4.0}  # rope_freqs with kept, scaled and smoothed pairs (scripts/fixtures/llama.py)
VARIANTS = {
    "untied": {},
    "tied": {"tie_word_embeddings": True},
    "llama3_rope": LLAMA3,
    "linear_rope": {"rope_linear": 2.0},
    "tied_llama3_gqa4": {"tie_word_embeddings": True, "num_key_value_heads": 1, **LLAMA3},
}
QUANT_TYPES = ["f16", "q8_0", "q4_1", "q5_1", "q4_k_m"]
EXPECTED_TYPES = {"f16": {"F16"}, "q8_0": {"Q8_0"}, "q4_1": {"Q4_1"}, "q5_1": {"Q5_1"}, "q4_k_m": {"Q4_K", "Q6_K"}}
MIN_CORR = {"f16": 0.9999, "q8_0": 0.999, "q5_1": 0.94, "q4_1": 0.8, "q4_k_m": 0.8}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_config_matches_transformers(variant, reference_for, hf_for):
    ov = VARIANTS[variant]
    c = reference_for("llama", **ov).config
    h = hf_for("llama", **ov).config
    assert (c.arch, c.n_layers, c.n_embd, c.n_ff) == ("llama", h.num_hidden_layers, h.hidden_size, h.intermediate_size)
    assert (c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v, c.rope_dim) == (
        h.num_attention_heads, h.num_key_value_heads, h.head_dim, h.head_dim, h.head_dim)
    assert c.vocab_size == h.vocab_size and c.tied_embeddings == h.tie_word_embeddings
    assert c.rms_eps == pytest.approx(h.rms_norm_eps, rel=1e-6)
    rope = h.rope_parameters
    assert c.rope_theta == rope["rope_theta"] and c.extra["rope_pairs"]
    assert c.extra["rope_factors"] == (rope["rope_type"] == "llama3")
    assert c.extra["rope_freq_scale"] == pytest.approx(1 / rope["factor"] if rope["rope_type"] == "linear" else 1.0)


def test_llama3_rope_freqs_cover_all_three_regimes(reference_for):
    """The fixture's rope_freqs keeps some pairs (1), divides some by the factor (4) and smooths
    the rest, so the test prompts exercise every branch of Llama 3's rule."""
    f = reference_for("llama", **LLAMA3).w.get("rope_freqs.weight")
    assert f.shape == (32,) and (f == 1).any() and (f == 4).any() and ((f > 1) & (f < 4)).any()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_f32_logits_match_transformers(variant, reference_for, hf_for):
    ref = reference_for("llama", **VARIANTS[variant])
    ids = prompt(24, vocab=ref.config.vocab_size)  # positions 0..23: beyond the llama3 fixture's short wavelengths
    got = ref.forward(ids, ref.new_cache(32))
    want = hf_logits(hf_for("llama", **VARIANTS[variant]), ids)
    assert got.dtype == np.float32 and got.shape == want.shape
    err = rel_err(got, want)
    assert err.max() < TOL, f"{variant}: relative error per position {err}"


@pytest.mark.parametrize("variant", ["untied", "tied_llama3_gqa4"])
def test_greedy_decode_matches_generate(variant, reference_for, hf_for):
    ref = reference_for("llama", **VARIANTS[variant])
    assert_greedy_matches_generate(ref, hf_for("llama", **VARIANTS[variant]), prompt(12, seed=3, vocab=ref.config.vocab_size),
                                   label=variant)


@pytest.mark.parametrize("outtype", QUANT_TYPES)
@pytest.mark.parametrize("variant", ["untied", "tied_llama3_gqa4"])
def test_quantized_file_matches_dequantized_transformers(variant, outtype, fixture_paths, reference_for):
    from fixtures import hf_model_from_gguf

    from reflex_runtime.families import load_reference

    ov = VARIANTS[variant]
    fx = fixture_paths("llama", outtype, **ov)
    ref = load_reference(fx.gguf)
    types = {t.type_name for t in ref.gguf.tensors.values()}
    assert EXPECTED_TYPES[outtype] <= types, f"{fx.gguf} has {types}"
    ids = prompt(16, seed=11, vocab=ref.config.vocab_size)
    got = ref.forward(ids, ref.new_cache(16))
    hf = hf_model_from_gguf(fx.gguf, fx.hf_dir)
    err = rel_err(got, hf_logits(hf, ids))
    assert err.max() < TOL, f"{variant} {outtype}: relative error per position {err}"
    full = reference_for("llama", **ov).forward(ids, reference_for("llama", **ov).new_cache(16))
    corr = min(np.corrcoef(got[i], full[i])[0, 1] for i in range(len(ids)))
    assert corr > MIN_CORR[outtype], f"{variant} {outtype}: correlation with f32 logits {corr}"
    assert_greedy_matches_generate(ref, hf, prompt(12, seed=3, vocab=ref.config.vocab_size), label=f"{variant} {outtype}")


# -- the forward contract ----------------------------------------------------------------------


def test_prefill_tree_and_cache_contract(reference_for):
    ref = reference_for("llama", **VARIANTS["tied_llama3_gqa4"])
    ids = prompt(15, seed=9, vocab=ref.config.vocab_size)
    assert_prefill_equals_steps(ref, ids)
    pos, mask = tree_6_5_4()
    one = ref.forward(ids, ref.new_cache(15), positions=pos, mask=mask)
    sep_a = ref.forward(ids[:11], ref.new_cache(11))
    sep_b = ref.forward(np.r_[ids[:6], ids[11:]], ref.new_cache(10))
    assert rel_err(one[:11], sep_a).max() < 1e-5
    assert rel_err(one[11:], sep_b[6:]).max() < 1e-5
    ids = prompt(14, seed=13, vocab=ref.config.vocab_size)
    assert_copy_is_independent(ref, ids)


# -- what the family refuses -------------------------------------------------------------------


def _rewrite(src, dst, *, drop=(), add_keys=None, add_tensors=None, replace=None):
    """Copy a GGUF with some keys added/replaced and tensors dropped/added (gguf-py writer)."""
    import gguf as gguf_py
    from quantize_gguf import SourceGGUF

    s = SourceGGUF(src)
    w = gguf_py.GGUFWriter(str(dst), "llama")
    for key, vtype, etype, value in s.metadata:
        if key == "general.architecture":
            continue
        if replace and key in replace:
            value = replace[key]
        w.add_key_value(key, value, gguf_py.GGUFValueType(vtype),
                        sub_type=None if etype is None else gguf_py.GGUFValueType(etype))
    for key, (value, vtype) in (add_keys or {}).items():
        w.add_key_value(key, value, vtype)
    for name, shape, t, off in s.tensors:
        if name in drop:
            continue
        data = np.frombuffer(s.tensor_bytes(shape, t, off), dtype=np.float32).reshape(tuple(reversed(shape)))
        w.add_tensor(name, data)
    for name, arr in (add_tensors or {}).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_files_the_family_refuses_are_named(fixture_paths, tmp_path):
    import gguf as gguf_py

    from reflex_runtime.families import read_config
    from reflex_runtime.modelfile.gguf_file import GGUFFile

    src = fixture_paths("llama", "f32", **LLAMA3).gguf
    S = gguf_py.GGUFValueType.STRING
    cases = [
        (dict(add_keys={"llama.rope.scaling.type": ("yarn", S)}), UnsupportedModelError, "rope scaling 'yarn'"),
        (dict(add_keys={"llama.expert_count": (8, gguf_py.GGUFValueType.UINT32)}), UnsupportedModelError, "Mixtral"),
        (dict(add_tensors={"blk.1.attn_q.bias": np.zeros(256, np.float32)}), UnsupportedModelError, "blk.1.attn_q.bias"),
        (dict(drop=("rope_freqs.weight",), add_tensors={"rope_freqs.weight": np.ones(31, np.float32)}), ModelFileError,
         "rope_freqs.weight"),
        (dict(drop=("blk.1.ffn_up.weight",)), ModelFileError, "blk.1.ffn_up.weight"),
        (dict(replace={"llama.rope.dimension_count": 65}), ModelFileError, "rope.dimension_count"),
    ]
    for i, (change, error, needle) in enumerate(cases):
        path = _rewrite(src, tmp_path / f"bad{i}.gguf", **change)
        with GGUFFile(path) as g, pytest.raises(error, match=needle):
            read_config(g)
    with GGUFFile(_rewrite(src, tmp_path / "linear.gguf", add_keys={
            "llama.rope.scaling.type": ("linear", S), "llama.rope.scaling.factor": (4.0, gguf_py.GGUFValueType.FLOAT32)})) as g:
        assert read_config(g).extra["rope_freq_scale"] == 0.25


# -- the real SmolLM2 --------------------------------------------------------------------------


def _hf_from_gguf(path):
    """transformers' own GGUF loading (what from_pretrained(gguf_file=) does, which also wants
    `accelerate`): its config from the metadata, its dequantization and q/k un-permutation."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = LlamaConfig(**load_gguf_checkpoint(path)["config"])
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    tensors = load_gguf_checkpoint(path, return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    return model


@pytest.mark.slow
def test_smollm2_matches_transformers_on_the_same_file(smollm2_path):
    """SmolLM2-135M-Instruct Q4_1: the reference against transformers loading the same GGUF
    (gguf_file=, its own dequantization and q/k un-permutation) on the chat prompt, at every
    position, and their greedy answers."""
    from reflex_runtime.families import load_reference
    from reflex_runtime.text.tokenizer import Tokenizer

    ref = load_reference(smollm2_path)
    tok = Tokenizer.from_gguf(ref.gguf)
    from reflex_runtime.text.chat import render_chat

    text = render_chat(tok.chat_template, [{"role": "user", "content": "What is the capital of France?"}])
    ids = tok.encode(text)
    hf = _hf_from_gguf(smollm2_path)
    got = ref.forward(ids, ref.new_cache(len(ids)))
    err = rel_err(got, hf_logits(hf, ids))
    assert err.max() < TOL, f"relative error per position {err}"
    from reference_checks import greedy_reference, hf_greedy

    ours, _ = greedy_reference(ref, ids, 8)
    theirs, _ = hf_greedy(hf, ids, 8)
    assert ours == theirs
    assert "Paris" in tok.decode(ours)
