"""Qwen3-MoE: the numpy reference against transformers' Qwen3MoeForCausalLM on tiny random models
converted by llama.cpp's own convert_hf_to_gguf.py (scripts/fixtures/qwen3moe.py), the routing
rule, the forward contract, bad files, the CLI and system1 on the CPU.

Relative error of a logits row: max_i |ref_i - hf_i| / max_i |hf_i|, checked at EVERY position.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from reference_checks import TOL, assert_greedy_matches_generate, assert_prefill_equals_steps, hf_logits, prompt, rel_err

from reflex_runtime.errors import ModelFileError, ReflexError

ARCH = "qwen3moe"
_E16K4 = dict(num_experts=16, num_experts_per_tok=4, num_attention_heads=2, num_key_value_heads=2, head_dim=128,
              moe_intermediate_size=192, tie_word_embeddings=True)
CONFIGS = {
    # 4 experts, top-2, GQA 4:2, head_dim 64, expert FFN 512 (!= hidden 256), untied LM head
    "e4k2": {},
    # 8 experts, top-1, GQA 8:2, head_dim 32, expert FFN 128, 3 layers, tied
    "e8k1": dict(num_experts=8, num_experts_per_tok=1, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                 moe_intermediate_size=128, num_hidden_layers=3, tie_word_embeddings=True),
    # 16 experts, top-4, no GQA (2:2), head_dim 128 (q is 256 wide = hidden), expert FFN 192
    "e16k4": _E16K4,
    # the same model trained with norm_topk_prob=False: the converter drops the flag
    "e16k4_nonorm": dict(_E16K4, norm_topk_prob=False),
}
# (config, outtype, ggml types the file must contain, min per-position correlation with f32 logits)
QUANTIZED = [
    ("e4k2", "q8_0", {"Q8_0"}, 0.999),
    ("e4k2", "q4_k_m", {"Q4_K", "Q6_K"}, 0.8),
    ("e16k4", "q4_k_m", {"Q4_K", "Q6_K"}, 0.8),
]

_HF_RENORMALIZED: dict = {}
MODEL_MEMOS = (_HF_RENORMALIZED,)  # emptied when this module ends (tests/conftest.py)


def hf_model(cfg: str, hf_for, fixture_paths):
    """The transformers model the GGUF of `cfg` means. llama.cpp always renormalizes the top-k
    weights of qwen3moe (the converter writes no norm_topk_prob), so a norm_topk_prob=False model
    is compared with the same weights run with norm_topk_prob=True."""
    overrides = CONFIGS[cfg]
    if overrides.get("norm_topk_prob", True):
        return hf_for(ARCH, **overrides)
    if cfg not in _HF_RENORMALIZED:
        import torch
        from transformers import AutoModelForCausalLM

        _HF_RENORMALIZED[cfg] = AutoModelForCausalLM.from_pretrained(
            fixture_paths(ARCH, **overrides).hf_dir, dtype=torch.float32, norm_topk_prob=True).eval()
    return _HF_RENORMALIZED[cfg]


# -- routing ------------------------------------------------------------------------------------


def test_route_ties_go_to_the_lower_expert_id():
    from reflex_runtime.reference.blocks import softmax_topk as route

    logits = np.array([[1.0, 3.0, 3.0, 0.0, 3.0],
                       [2.0, 2.0, 2.0, 2.0, 2.0],
                       [0.0, 0.0, 5.0, 0.0, 1.0]], dtype=np.float32)
    ids, w = route(logits, 2, normalize=True)
    assert ids.tolist() == [[1, 2], [0, 1], [2, 4]]
    np.testing.assert_allclose(w[:2], 0.5, rtol=1e-6)
    assert w[2, 0] == pytest.approx(np.exp(5) / (np.exp(5) + np.exp(1)), rel=1e-6)
    ids, w = route(logits, 1, normalize=False)
    assert ids[:, 0].tolist() == [1, 0, 2]
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(w[:, 0], p[[0, 1, 2], [1, 0, 2]], rtol=1e-6)
    assert w.dtype == np.float32 and ids.shape == (3, 1)
    # many experts, many ties (an unstable sort gets this wrong): Qwen3-30B-A3B has 128, top-8
    big = np.zeros((1, 128), dtype=np.float32)
    big[0, ::3] = -1.0
    ids, w = route(big, 8, normalize=True)
    assert ids[0].tolist() == [1, 2, 4, 5, 7, 8, 10, 11]
    np.testing.assert_allclose(w, 1 / 8, rtol=1e-6)


def test_route_matches_torch_topk_without_ties():
    import torch

    from reflex_runtime.reference.blocks import softmax_topk as route

    logits = np.random.default_rng(0).normal(size=(64, 16)).astype(np.float32)
    for k, norm in [(1, True), (4, True), (4, False), (16, True)]:
        ids, w = route(logits, k, norm)
        p = torch.softmax(torch.from_numpy(logits), dim=-1)
        tw, ti = torch.topk(p, k, dim=-1)
        if norm:
            tw = tw / tw.sum(-1, keepdim=True)
        assert ids.tolist() == ti.tolist()
        np.testing.assert_allclose(w, tw.numpy(), rtol=1e-6, atol=1e-7)


# -- configuration and what the converter writes -------------------------------------------------


@pytest.mark.parametrize("cfg", list(CONFIGS))
def test_config_matches_transformers(cfg, reference_for, hf_for):
    ref = reference_for(ARCH, **CONFIGS[cfg])
    c, h = ref.config, hf_for(ARCH, **CONFIGS[cfg]).config
    assert c.arch == ARCH
    assert (c.n_layers, c.n_embd, c.n_ff) == (h.num_hidden_layers, h.hidden_size, h.intermediate_size)
    assert (c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v) == (
        h.num_attention_heads, h.num_key_value_heads, h.head_dim, h.head_dim)
    assert (c.extra["n_expert"], c.extra["n_expert_used"], c.extra["n_ff_exp"]) == (
        h.num_experts, h.num_experts_per_tok, h.moe_intermediate_size)
    assert c.extra["norm_topk_prob"] is True  # whatever the HF config said: llama.cpp's rule
    assert c.vocab_size == h.vocab_size and c.tied_embeddings == h.tie_word_embeddings
    assert c.rope_theta == h.rope_parameters["rope_theta"]
    assert c.rms_eps == pytest.approx(h.rms_norm_eps, rel=1e-6)
    # The converter's keys and the stacked expert tensors (ggml order: shape[0] is the row).
    md = ref.gguf.metadata
    assert md["qwen3moe.expert_count"] == h.num_experts
    assert md["qwen3moe.expert_used_count"] == h.num_experts_per_tok
    assert md["qwen3moe.expert_feed_forward_length"] == h.moe_intermediate_size
    assert not [k for k in md if "norm_topk" in k or "expert_weights" in k or "gating_func" in k]
    t = ref.gguf.tensors
    e, f, d = h.num_experts, h.moe_intermediate_size, h.hidden_size
    for il in range(h.num_hidden_layers):
        assert t[f"blk.{il}.ffn_gate_inp.weight"].shape == (d, e)
        assert t[f"blk.{il}.ffn_gate_exps.weight"].shape == (d, f, e)
        assert t[f"blk.{il}.ffn_up_exps.weight"].shape == (d, f, e)
        assert t[f"blk.{il}.ffn_down_exps.weight"].shape == (f, d, e)


def test_norm_topk_prob_false_does_not_survive_conversion(fixture_paths):
    """The two fixtures differ only in norm_topk_prob: the converter writes the same file."""
    a = fixture_paths(ARCH, **CONFIGS["e16k4"]).gguf
    b = fixture_paths(ARCH, **CONFIGS["e16k4_nonorm"]).gguf
    assert a.read_bytes() == b.read_bytes()


# -- logits against transformers -----------------------------------------------------------------


@pytest.mark.parametrize("cfg", list(CONFIGS))
def test_f32_logits_match_transformers(cfg, reference_for, hf_for, fixture_paths):
    ref = reference_for(ARCH, **CONFIGS[cfg])
    ids = prompt(24)
    got = ref.forward(ids, ref.new_cache(24))
    want = hf_logits(hf_model(cfg, hf_for, fixture_paths), ids)
    assert got.dtype == np.float32 and got.shape == want.shape
    err = rel_err(got, want)
    assert err.max() < TOL, f"{cfg}: relative error per position {err}"
    if not CONFIGS[cfg].get("norm_topk_prob", True):
        # and transformers' own norm_topk_prob=False model really is a different model
        assert rel_err(got, hf_logits(hf_for(ARCH, **CONFIGS[cfg]), ids)).max() > 1e-2


@pytest.mark.parametrize("cfg", list(CONFIGS))
def test_greedy_decode_matches_generate(cfg, reference_for, hf_for, fixture_paths):
    ref, hf = reference_for(ARCH, **CONFIGS[cfg]), hf_model(cfg, hf_for, fixture_paths)
    assert_greedy_matches_generate(ref, hf, prompt(12, seed=3), label=cfg)


@pytest.mark.parametrize("cfg,outtype,types,min_corr", QUANTIZED)
def test_quantized_file_matches_dequantized_transformers(cfg, outtype, types, min_corr, fixture_paths, reference_for):
    from fixtures.qwen3moe import hf_qwen3moe_from_gguf

    from reflex_runtime.modelfile.ggml_types import GGML_TYPES
    from reflex_runtime.families import load_reference

    fx = fixture_paths(ARCH, outtype, **CONFIGS[cfg])
    ref = load_reference(fx.gguf)
    have = {GGML_TYPES[t.ggml_type].name for t in ref.gguf.tensors.values()}
    assert types <= have, f"{fx.gguf} has {have}"
    exps = {GGML_TYPES[t.ggml_type].name for n, t in ref.gguf.tensors.items() if "_exps" in n}
    assert exps.isdisjoint({"F32", "F16"}), f"expert tensors not quantized: {exps}"
    ids = prompt(16, seed=11)
    got = ref.forward(ids, ref.new_cache(16))
    want = hf_logits(hf_qwen3moe_from_gguf(fx.gguf, fx.hf_dir), ids)
    err = rel_err(got, want)
    assert err.max() < TOL, f"{cfg} {outtype}: relative error per position {err}"
    full_ref = reference_for(ARCH, **CONFIGS[cfg])
    full = full_ref.forward(ids, full_ref.new_cache(16))
    corr = min(np.corrcoef(got[i], full[i])[0, 1] for i in range(len(ids)))
    assert corr > min_corr, f"{cfg} {outtype}: correlation with f32 logits {corr}"
    # Without kept weights only the routed experts' rows are dequantized: same logits.
    lean = load_reference(fx.gguf, keep_weights=False)
    assert rel_err(lean.forward(ids, lean.new_cache(16)), got).max() < 1e-6
    assert lean.w.nbytes_held() == 0


# -- the forward contract ------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", ["e4k2", "e8k1", "e16k4"])
def test_prefill_equals_token_by_token(cfg, reference_for):
    ref = reference_for(ARCH, **CONFIGS[cfg])
    ids = prompt(20, seed=5)
    assert_prefill_equals_steps(ref, ids)


def test_weights_not_kept_give_the_same_logits(fixture_paths):
    """A file whose weights as float32 would not fit (a 35B-A3B's experts: ~140 GB) is run with
    nothing kept: each forward dequantizes what it uses, only the routed experts' rows. Same logits;
    the choice follows the machine's memory (half of it at most)."""
    from reflex_runtime.families import load_reference, reference_keeps_weights
    from reflex_runtime.modelfile.gguf_file import GGUFFile

    g = GGUFFile(fixture_paths(ARCH, "q8_0", **CONFIGS["e16k4"]).gguf)
    need = 4 * sum(t.n_elements for t in g.tensors.values())
    assert reference_keeps_weights(g, memory=2 * need) and not reference_keeps_weights(g, memory=2 * need - 8)
    ids = prompt(9, seed=3)
    kept, lean = load_reference(g, keep_weights=True), load_reference(g, keep_weights=False)
    a = kept.forward(ids, kept.new_cache(16))
    b = lean.forward(ids, lean.new_cache(16))
    np.testing.assert_array_equal(a, b)
    assert kept.w.nbytes_held() > 0 and lean.w.nbytes_held() == 0


def test_tree_mask_branches_equal_separate_runs(reference_for):
    ref = reference_for(ARCH, **CONFIGS["e16k4"])
    ids = prompt(15, seed=9)
    p, a, b = ids[:6], ids[6:11], ids[11:]
    sep_a = ref.forward(np.r_[p, a], ref.new_cache(11))
    sep_b = ref.forward(np.r_[p, b], ref.new_cache(10))
    pos = np.r_[np.arange(6), 6 + np.arange(5), 6 + np.arange(4)]
    mask = np.zeros((15, 15), dtype=bool)
    mask[:, :6] = True
    mask[:6, :6] = np.tril(np.ones((6, 6), dtype=bool))
    mask[6:11, 6:11] = np.tril(np.ones((5, 5), dtype=bool))
    mask[11:, 11:] = np.tril(np.ones((4, 4), dtype=bool))
    one = ref.forward(ids, ref.new_cache(15), positions=pos, mask=mask)
    assert rel_err(one[:11], sep_a).max() < 1e-5
    assert rel_err(one[11:], sep_b[6:]).max() < 1e-5


# -- bad files -----------------------------------------------------------------------------------


def _write_moe_gguf(path, *, n_layers=1, n_embd=32, n_ff=16, n_expert=4, used=2, drop=(), down_transposed=False,
                    skip_keys=()):
    import gguf

    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), ARCH)
    keys = {
        "block_count": lambda: w.add_block_count(n_layers),
        "embedding_length": lambda: w.add_embedding_length(n_embd),
        "attention.head_count": lambda: w.add_head_count(2),
        "expert_count": lambda: w.add_expert_count(n_expert),
        "expert_used_count": lambda: (w.add_expert_used_count(used) if isinstance(used, int)
                                      else w.add_float32(f"{ARCH}.expert_used_count", used) if isinstance(used, float)
                                      else w.add_array(f"{ARCH}.expert_used_count", list(used))),
        "expert_feed_forward_length": lambda: w.add_expert_feed_forward_length(n_ff),
    }
    for k, add in keys.items():
        if k not in skip_keys:
            add()
    w.add_tensor("token_embd.weight", rng.normal(size=(8, n_embd)).astype(np.float32))
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    for il in range(n_layers):
        for kind, shape in (("attn_norm", (n_embd,)), ("ffn_norm", (n_embd,)), ("attn_q", (n_embd, n_embd)),
                            ("attn_k", (n_embd, n_embd)), ("attn_v", (n_embd, n_embd)),
                            ("attn_output", (n_embd, n_embd))):  # the attention trunk (2 heads of 16)
            w.add_tensor(f"blk.{il}.{kind}.weight", rng.normal(size=shape).astype(np.float32))
        tensors = {
            "ffn_gate_inp": (n_expert, n_embd),
            "ffn_gate_exps": (n_expert, n_ff, n_embd),
            "ffn_up_exps": (n_expert, n_ff, n_embd),
            "ffn_down_exps": (n_expert, n_ff, n_embd) if down_transposed else (n_expert, n_embd, n_ff),
        }
        for kind, shape in tensors.items():
            if kind not in drop:
                w.add_tensor(f"blk.{il}.{kind}.weight", rng.normal(size=shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("kwargs,needle", [
    (dict(used=5), "expert_used_count 5"),
    (dict(used=0), "expert_used_count 0"),
    (dict(skip_keys=("expert_count",)), "missing required key 'qwen3moe.expert_count'"),
    (dict(skip_keys=("expert_used_count",)), "missing required key 'qwen3moe.expert_used_count'"),
    (dict(n_layers=2, used=[2, 1]), "one integer for every layer"),
    (dict(used=2.0), "'qwen3moe.expert_used_count' should be an integer"),
    (dict(drop=("ffn_gate_inp",)), "no tensor 'blk.0.ffn_gate_inp.weight'"),
    (dict(drop=("ffn_up_exps",)), "no tensor 'blk.0.ffn_up_exps.weight'"),
    (dict(down_transposed=True), "'blk.0.ffn_down_exps.weight' has shape (32, 16, 4), expected (16, 32, 4)"),
    (dict(skip_keys=("expert_feed_forward_length",)), "no expert_feed_forward_length"),
])
def test_bad_files_get_one_line_errors(tmp_path, kwargs, needle):
    from reflex_runtime.modelfile.gguf_file import GGUFFile
    from reflex_runtime.families import read_config

    path = _write_moe_gguf(tmp_path / "bad.gguf", **kwargs)
    with pytest.raises(ModelFileError) as e:
        read_config(GGUFFile(path))
    msg = str(e.value)
    assert needle in msg and "\n" not in msg, msg


def test_well_formed_small_file_and_per_layer_counts(tmp_path):
    from reflex_runtime.modelfile.gguf_file import GGUFFile
    from reflex_runtime.families import read_config

    c = read_config(GGUFFile(_write_moe_gguf(tmp_path / "ok.gguf", n_layers=2, used=[3, 3])))
    assert (c.extra["n_expert"], c.extra["n_expert_used"], c.extra["n_ff_exp"]) == (4, 3, 16)


def test_cli_reports_a_bad_file_in_one_line(tmp_path):
    path = _write_moe_gguf(tmp_path / "bad.gguf", down_transposed=True)
    r = subprocess.run([sys.executable, "-m", "reflex_runtime.cli", "generate", "hi", "--backend", "cpu",
                        "--model", str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == ModelFileError.exit_code and r.stdout == ""
    assert r.stderr.startswith("reflex: error:") and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "ffn_down_exps" in r.stderr
    assert issubclass(ModelFileError, ReflexError)


# -- the CLI and system1 on the CPU ---------------------------------------------------------------


def test_cli_generate_runs_on_the_fixture(fixture_paths, hf_for):
    import torch
    from transformers import GenerationConfig

    from reflex_runtime.modelfile.gguf_file import GGUFFile
    from reflex_runtime.text.tokenizer import Tokenizer

    fx = fixture_paths(ARCH)
    text_prompt = "The capital of France is"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    r = subprocess.run([sys.executable, "-m", "reflex_runtime.cli", "generate", text_prompt, "-n", "8", "--backend", "cpu",
                        "--model", str(fx.gguf), "--ignore-eos", "--json"], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    rec = res["record"]
    assert (rec["architecture"], rec["backend"], rec["generated_tokens"]) == (ARCH, "cpu", 8)
    # the text is transformers' greedy continuation of the same prompt ids
    tok = Tokenizer.from_gguf(GGUFFile(fx.gguf))
    ids = tok.encode(text_prompt)
    assert rec["prompt_tokens"] == len(ids)
    gen = GenerationConfig(max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        out = hf_for(ARCH).generate(torch.as_tensor([ids]), generation_config=gen)
    assert res["text"] == tok.decode(out[0, len(ids):].tolist())


def test_system1_scores_equal_transformers_summed_logprobs(fixture_paths, hf_for):
    import torch

    from reflex_runtime.loader import load_engine

    fx = fixture_paths(ARCH)
    eng = load_engine(str(fx.gguf), "cpu", log=lambda m: None)
    cands = [" Paris", " London", " Berlin", " the city of lights", " Paris"]
    res = eng.system1(prompt="The capital of France is", candidates=cands)
    ids = eng.prompt_ids("The capital of France is")
    hf = hf_for(ARCH)
    for c in res["candidates"]:
        with torch.no_grad():
            logits = hf(torch.tensor([list(ids) + c["token_ids"]])).logits[0].double()
        logp = torch.log_softmax(logits, dim=-1)
        want = sum(float(logp[len(ids) - 1 + j, t]) for j, t in enumerate(c["token_ids"]))
        assert abs(c["score"] - want) <= 1e-4 * max(1.0, abs(want)), (c["text"], c["score"], want)
        assert c["score"] == pytest.approx(sum(c["token_logprobs"]), abs=1e-5)
    assert res["candidates"][0]["score"] == res["candidates"][4]["score"]
    assert sum(c["probability"] for c in res["candidates"]) == pytest.approx(1.0, abs=1e-12)
    assert res["best_index"] == int(np.argmax([c["score"] for c in res["candidates"]]))
