"""Qwen3.5 hybrid (`qwen35`, `qwen35moe`) in the numpy reference against `transformers`, on tiny
random models converted by llama.cpp's own convert_hf_to_gguf.py (scripts/fixtures/qwen35.py):
Gated DeltaNet layers (conv state + delta-rule state), gated full attention, the MoE with its
shared expert, the files' MTP blocks, quantized files, and the recurrent-state cache contract.

Relative error of a logits row: max_i |ref_i - hf_i| / max_i |hf_i|, checked at EVERY position.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from reference_checks import TOL, assert_copy_is_independent, assert_greedy_matches_generate, hf_logits, prompt, rel_err

pytest.importorskip("torch")
pytest.importorskip("transformers")

from reflex_runtime.errors import RequestError, UnsupportedModelError  # noqa: E402
from reflex_runtime.families.qwen35 import delta_net  # noqa: E402

PROMPT_LEN = 70  # more than one 64-token chunk of the delta rule (ours and transformers')

# name -> (arch, overrides). The defaults (scripts/fixtures/qwen35.py): hidden 256, 4 layers
# (linear, linear, linear, full), 4 query / 2 kv heads of 64 (rope on 16 dims), linear attention
# with 2 key / 4 value heads of 32 (the converter reorders value heads), conv kernel 4, one MTP
# block, tied embeddings; MoE: 8 experts, top 2, expert ff 256, shared expert ff 512.
CONFIGS = {
    "dense": ("qwen35", {}),
    "dense-b": ("qwen35", dict(
        num_hidden_layers=5,
        layer_types=["full_attention", "linear_attention", "linear_attention", "full_attention", "linear_attention"],
        num_attention_heads=2, num_key_value_heads=1, head_dim=128,
        rope_parameters={"partial_rotary_factor": 0.5},  # rope on 64 of 128 dims
        linear_num_key_heads=4, linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=64,
        linear_conv_kernel_dim=3, tie_word_embeddings=False, intermediate_size=768)),
    "moe": ("qwen35moe", {}),
    "moe-b": ("qwen35moe", dict(
        full_attention_interval=2,  # linear, full, linear, full (written as recurrent_layers)
        num_attention_heads=8, num_key_value_heads=4, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=16, linear_value_head_dim=16,
        num_experts=4, num_experts_per_tok=3, moe_intermediate_size=128, shared_expert_intermediate_size=256)),
}

_FX: dict = {}
_REF: dict = {}
_HF: dict = {}
MODEL_MEMOS = (_REF, _HF)  # emptied when this module ends (tests/conftest.py)


def fixture(name: str, outtype: str = "f32"):
    key = (name, outtype)
    if key not in _FX:
        from fixtures import make_fixture

        arch, overrides = CONFIGS[name]
        _FX[key] = make_fixture(arch, outtype, 0, **overrides)
    return _FX[key]


def reference(name: str, outtype: str = "f32"):
    key = (name, outtype)
    if key not in _REF:
        from reflex_runtime.families import load_reference

        _REF[key] = load_reference(fixture(name, outtype).gguf)
    return _REF[key]


def hf_model(name: str):
    if name not in _HF:
        import torch
        from transformers import AutoModelForCausalLM

        _HF[name] = AutoModelForCausalLM.from_pretrained(fixture(name).hf_dir, dtype=torch.float32).eval()
    return _HF[name]


# -- configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CONFIGS))
def test_config_matches_transformers(name):
    c, h = reference(name).config, hf_model(name).config
    e = c.extra
    assert c.arch == CONFIGS[name][0]
    assert (c.n_layers, c.n_embd, c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v) == (
        h.num_hidden_layers, h.hidden_size, h.num_attention_heads, h.num_key_value_heads, h.head_dim, h.head_dim)
    assert e["nextn_predict_layers"] == 1 and e["n_blocks"] == h.num_hidden_layers + 1  # the MTP block
    assert list(e["recurrent_layers"]) == [t == "linear_attention" for t in h.layer_types]
    assert any(e["recurrent_layers"]) and not all(e["recurrent_layers"])
    assert (e["n_k_heads"], e["n_v_heads"], e["head_k_dim"], e["head_v_dim"], e["conv_kernel"]) == (
        h.linear_num_key_heads, h.linear_num_value_heads, h.linear_key_head_dim, h.linear_value_head_dim,
        h.linear_conv_kernel_dim)
    assert c.rope_dim == int(h.head_dim * h.rope_parameters["partial_rotary_factor"])
    assert c.rope_theta == h.rope_parameters["rope_theta"]
    assert c.rms_eps == pytest.approx(h.rms_norm_eps, rel=1e-6)
    assert c.vocab_size == h.vocab_size and c.tied_embeddings == h.tie_word_embeddings
    if c.arch == "qwen35moe":
        assert e["n_expert"] == h.num_experts
        assert set(e["n_expert_used"]) == {h.num_experts_per_tok}
        assert set(e["n_ff_exp"]) == {h.moe_intermediate_size}
        assert e["n_ff_shexp"] == h.shared_expert_intermediate_size
    else:
        assert c.n_ff == h.intermediate_size


def test_recurrent_layers_key_wins_over_interval():
    """moe-b's layer pattern (period 2) reaches the file only as attention.recurrent_layers; the
    converter still writes full_attention_interval = 4 there."""
    ref = reference("moe-b")
    assert ref.gguf.arch_get("full_attention_interval") == 4
    assert ref.config.extra["recurrent_layers"] == (True, False, True, False)


# -- logits against transformers -----------------------------------------------------------------


@pytest.mark.parametrize("name", list(CONFIGS))
def test_f32_logits_match_transformers(name):
    ref = reference(name)
    ids = prompt(PROMPT_LEN)
    got = ref.forward(ids, ref.new_cache(PROMPT_LEN))
    want = hf_logits(hf_model(name), ids)
    assert got.dtype == np.float32 and got.shape == want.shape
    err = rel_err(got, want)
    assert err.max() < TOL, f"{name}: relative error per position {err}"


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_decode_matches_generate(name):
    ref, hf = reference(name), hf_model(name)
    assert_greedy_matches_generate(ref, hf, prompt(12, seed=3), label=name)


# -- the delta rule: chunked prefill == recurrent ------------------------------------------------


def _random_delta_inputs(n, h=3, dk=16, dv=8, seed=0):
    rng = np.random.default_rng(seed)
    f = np.float32
    q = delta_net.l2norm(rng.standard_normal((n, h, dk)).astype(f), 1e-6) * f(dk ** -0.5)
    k = delta_net.l2norm(rng.standard_normal((n, h, dk)).astype(f), 1e-6)
    v = rng.standard_normal((n, h, dv)).astype(f)
    g = -rng.uniform(0.001, 4.0, (n, h)).astype(f)  # from almost no decay to strong decay
    beta = rng.uniform(0.0, 1.0, (n, h)).astype(f)
    s0 = (0.5 * rng.standard_normal((h, dk, dv))).astype(f)
    return q, k, v, g, beta, s0


@pytest.mark.parametrize("chunk", [1, 5, 16, 64, 200])
def test_delta_rule_chunked_equals_recurrent(chunk):
    q, k, v, g, beta, s0 = _random_delta_inputs(130)
    o1, s1 = delta_net.delta_rule_recurrent(q, k, v, g, beta, s0)
    o2, s2 = delta_net.delta_rule_chunked(q, k, v, g, beta, s0, chunk)
    assert o2.dtype == np.float32 and s2.dtype == np.float32
    assert rel_err(o2.reshape(130, -1), o1.reshape(130, -1)).max() < 1e-5
    assert np.abs(s2 - s1).max() / np.abs(s1).max() < 1e-5
    # the start state matters (a chunked form that ignored it would fail here)
    o3, _ = delta_net.delta_rule_chunked(q, k, v, g, beta, np.zeros_like(s0), chunk)
    assert rel_err(o3[:4].reshape(4, -1), o1[:4].reshape(4, -1)).max() > 1e-2


def test_delta_rule_matches_its_definition():
    """One step by hand: S <- exp(g) S; d = beta (v - S^T k); S <- S + k d^T; o = S^T q."""
    q, k, v, g, beta, s0 = _random_delta_inputs(1, h=2, dk=4, dv=3, seed=5)
    o, s = delta_net.delta_rule_recurrent(q, k, v, g, beta, s0)
    for hh in range(2):
        st = np.exp(g[0, hh]) * s0[hh].astype(np.float64)
        d = beta[0, hh] * (v[0, hh] - st.T @ k[0, hh])
        st = st + np.outer(k[0, hh], d)
        assert np.allclose(s[hh], st, atol=1e-6) and np.allclose(o[0, hh], st.T @ q[0, hh], atol=1e-6)


def test_causal_conv1d_state_rolls():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((9, 5)).astype(np.float32)
    w = rng.standard_normal((5, 4)).astype(np.float32)
    whole, st = delta_net.causal_conv1d(x, np.zeros((3, 5), np.float32), w)
    # by definition: out_t = sum_j w[:, j] x[t - 3 + j], zeros before the start
    padded = np.concatenate([np.zeros((3, 5), np.float32), x])
    want = np.stack([(padded[t:t + 4] * w.T).sum(axis=0) for t in range(9)])
    assert np.allclose(whole, want, atol=1e-6) and np.array_equal(st, x[-3:])
    a, sa = delta_net.causal_conv1d(x[:2], np.zeros((3, 5), np.float32), w)  # shorter than the kernel
    b, sb = delta_net.causal_conv1d(x[2:], sa, w)
    assert np.allclose(np.concatenate([a, b]), whole, atol=1e-6) and np.array_equal(sb, st)


@pytest.mark.parametrize("name", ["dense", "moe-b"])
def test_prefill_equals_token_by_token(name):
    """Prefill runs the chunked delta rule (here also with 8-token chunks), one-token calls the
    recurrent one; a split prefill carries conv and delta-rule state across calls."""
    ref = reference(name)
    ids = prompt(20, seed=5)
    once = ref.forward(ids, ref.new_cache(20))
    cache = ref.new_cache(20)
    steps = np.concatenate([ref.forward([t], cache) for t in ids])
    assert cache.length == 20
    assert rel_err(steps, once).max() < 5e-5
    cache = ref.new_cache(20)
    chunks = np.concatenate([ref.forward(ids[:2], cache), ref.forward(ids[2:9], cache), ref.forward(ids[9:], cache)])
    assert rel_err(chunks, once).max() < 5e-5
    ref.chunk = 8
    try:
        small = ref.forward(ids, ref.new_cache(20))
    finally:
        ref.chunk = delta_net.CHUNK
    assert rel_err(small, once).max() < 5e-5


# -- multi-token-prediction blocks ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["dense", "moe"])
def test_files_with_and_without_mtp_blocks(name):
    from fixtures.qwen35 import convert_variant

    from reflex_runtime.families import load_reference

    fx = fixture(name)
    with_mtp = reference(name)
    n = with_mtp.config.n_layers
    assert any(t.startswith(f"blk.{n}.nextn.") for t in with_mtp.gguf.tensors)
    without = load_reference(convert_variant(fx, "f32", "--no-nextn"))
    assert without.gguf.arch_get("nextn_predict_layers") is None
    assert without.gguf.arch_get("block_count") == n and without.config.n_layers == n
    assert not any(t.startswith(f"blk.{n}.") for t in without.gguf.tensors)
    assert without.config.extra["recurrent_layers"] == with_mtp.config.extra["recurrent_layers"]
    ids = prompt(16, seed=2)
    a = with_mtp.forward(ids, with_mtp.new_cache(16))
    b = without.forward(ids, without.new_cache(16))
    assert np.array_equal(a, b)
    # the draft-only file (--mtp) is not a model to run
    with pytest.raises(UnsupportedModelError, match="multi-token-prediction"):
        load_reference(convert_variant(fx, "f32", "--mtp"))


@pytest.mark.parametrize("name,flag", [("dense", "--fuse-qkv"), ("moe", "--fuse-gate-up-exps")])
def test_fused_tensor_files(name, flag):
    """The converter's optional fusions (attn_qkv on full-attention layers; ffn_gate_up_exps)."""
    from fixtures.qwen35 import convert_variant

    from reflex_runtime.families import load_reference

    fused = load_reference(convert_variant(fixture(name), "f32", flag))
    want = "blk.3.attn_qkv.weight" if flag == "--fuse-qkv" else "blk.0.ffn_gate_up_exps.weight"
    assert want in fused.gguf.tensors
    ids = prompt(12, seed=4)
    base = reference(name)
    assert rel_err(fused.forward(ids, fused.new_cache(12)), base.forward(ids, base.new_cache(12))).max() < 1e-6


# -- quantized files against transformers fed the same dequantized weights ----------------------


# ggml types each file must contain, and the least median (over positions) correlation of its
# logits with the f32 file's. These random hybrids amplify weight noise more than the dense
# Qwen3 fixture, and a routed MoE flips experts on small changes, so the bound is a median,
# set below the measured values (dense q8_0 0.999, q4_k_m 0.90; MoE q8_0 0.998, q4_k_m 0.73);
# a quantizer writing garbage gives about 0.
QUANT = {"q8_0": ({"Q8_0"}, {"dense": 0.995, "moe": 0.99}), "q4_k_m": ({"Q4_K", "Q6_K"}, {"dense": 0.8, "moe": 0.6})}


@pytest.mark.parametrize("outtype", list(QUANT))
@pytest.mark.parametrize("name", ["dense", "moe"])
def test_quantized_file_matches_dequantized_transformers(name, outtype):
    from fixtures.qwen35 import hf_model_from_gguf

    from reflex_runtime.modelfile.ggml_types import GGML_TYPES

    fx = fixture(name, outtype)
    ref = reference(name, outtype)
    types = {GGML_TYPES[t.ggml_type].name for t in ref.gguf.tensors.values()}
    assert QUANT[outtype][0] <= types, f"{fx.gguf} has {types}"
    ids = prompt(16, seed=11)
    got = ref.forward(ids, ref.new_cache(16))
    err = rel_err(got, hf_logits(hf_model_from_gguf(fx.gguf, fx.hf_dir), ids))
    assert err.max() < TOL, f"{name} {outtype}: relative error per position {err}"
    full = reference(name).forward(ids, reference(name).new_cache(16))
    corr = float(np.median([np.corrcoef(got[i], full[i])[0, 1] for i in range(len(ids))]))
    assert corr > QUANT[outtype][1][name], f"{name} {outtype}: median correlation with f32 logits {corr}"


# -- the cache contract --------------------------------------------------------------------------


def test_cache_copy_truncate_and_masks():
    ref = reference("dense")
    assert ref.supports_tree_mask is False
    ids = prompt(14, seed=13)
    cache = assert_copy_is_independent(ref, ids)
    p, b = ids[:6], ids[10:]
    sep_b = ref.forward(np.r_[p, b], ref.new_cache(10))

    cache.truncate(10)  # to its own length: nothing to undo
    assert cache.length == 10
    with pytest.raises(RequestError, match="recurrent"):
        cache.truncate(6)
    with pytest.raises(RequestError):
        cache.truncate(11)
    cache.truncate(0)  # back to the empty state
    assert cache.length == 0 and all(np.all(s == 0) for s in cache.ssm if s is not None)
    assert rel_err(ref.forward(np.r_[p, b], cache), sep_b).max() < 1e-6

    # only the causal mask: recurrent state cannot skip tokens
    causal = np.tril(np.ones((4, 4), dtype=bool))
    assert np.array_equal(ref.forward(b, ref.new_cache(4), mask=causal), ref.forward(b, ref.new_cache(4)))
    tree = causal.copy()
    tree[2:, :2] = False
    cache = ref.new_cache(8)
    ref.forward(p[:3], cache)
    conv, ssm = [s.copy() for s in cache.conv if s is not None], [s.copy() for s in cache.ssm if s is not None]
    with pytest.raises(RequestError, match="causal"):
        ref.forward(b, cache, mask=tree)
    with pytest.raises(RequestError):
        ref.forward(ids[:6], cache)  # 3 + 6 > 8
    assert cache.length == 3  # failed calls left the state alone
    assert all(np.array_equal(x, y) for x, y in zip(conv, [s for s in cache.conv if s is not None]))
    assert all(np.array_equal(x, y) for x, y in zip(ssm, [s for s in cache.ssm if s is not None]))


# -- the CPU backend: generate and system1 --------------------------------------------------------


def test_cli_generate_runs_on_cpu():
    fx = fixture("moe")
    r = subprocess.run([sys.executable, "-m", "reflex_runtime.cli", "generate", "The capital of France is",
                        "--model", str(fx.gguf), "--backend", "cpu", "--max-tokens", "6", "--json", "--ignore-eos"],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"), timeout=300)
    assert r.returncode == 0, r.stderr
    import json

    out = json.loads(r.stdout)
    assert out["text"] and out["record"]["generated_tokens"] == 6


@pytest.mark.parametrize("name", ["dense-b", "moe"])
def test_system1_scores_match_transformers(name):
    import torch

    from reflex_runtime.reference.runner import ReferenceRunner

    ref, hf = reference(name), hf_model(name)
    runner = ReferenceRunner(ref)
    p = [int(t) for t in prompt(9, seed=21)]
    rng = np.random.default_rng(22)
    c1 = [int(t) for t in rng.integers(4, 151643, 4)]
    c2 = c1[:2] + [int(t) for t in rng.integers(4, 151643, 3)]  # shares a prefix with c1
    c3 = [int(rng.integers(4, 151643))]  # one token
    cands = [c1, c2, c3, list(c1)]  # c1 twice
    scores = runner.score(p, cands)
    for cand, lp in zip(cands, scores):
        with torch.no_grad():
            logits = hf(torch.as_tensor([p + cand])).logits[0].double()
        logp = torch.log_softmax(logits, dim=-1)
        want = [float(logp[len(p) - 1 + j, t]) for j, t in enumerate(cand)]
        assert len(lp) == len(cand)
        assert abs(sum(lp) - sum(want)) / abs(sum(want)) < TOL, (name, cand, lp, want)
        assert np.allclose(lp, want, rtol=TOL, atol=1e-4)
    assert scores[0] == scores[3]  # identical candidates, identical scores (bit for bit)


def test_engine_system1_on_cpu():
    from reflex_runtime.loader import load_engine

    eng = load_engine(str(fixture("dense").gguf), backend="cpu", log=lambda m: None)
    res = eng.system1(prompt="The capital of France is", candidates=[" Paris", " London", " Paris"])
    c = res["candidates"]
    assert c[0]["score"] == c[2]["score"] and c[0]["score"] != c[1]["score"]
    assert all(x["score"] < 0 for x in c) and abs(sum(x["probability"] for x in c) - 1) < 1e-6
