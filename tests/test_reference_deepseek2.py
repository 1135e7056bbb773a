"""The numpy reference of `deepseek2` (DeepSeek-V2, V2-Lite, V3) against `transformers` on tiny
random models converted by llama.cpp's own convert_hf_to_gguf.py (scripts/fixtures/deepseek.py),
plus the forward contract (cache, positions, tree masks), the legacy attn_kv_b layout, quantized
files, `reflex generate` and system1 on the CPU.

Relative error of a logits row: max_i |ref_i - hf_i| / max_i |hf_i|, checked at EVERY position.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from reference_checks import TOL, assert_greedy_matches_generate, hf_logits, prompt, rel_err, tree_6_5_4


# name -> (fixture builder, overrides). Together they cover: q path with and without q_lora;
# softmax routing over all experts (V2-Lite), softmax group-limited routing (V2), sigmoid +
# exp_probs_b + group top-k (V3, with and without q_lora); 8/12/16 experts, top-2/3/4, 1/2/4
# groups, 0/1/2 leading dense layers, 1/2 shared experts, rope dims 8/16/32, YaRN with mscale
# 0.707 / 1.0 / none and no rope scaling; routed_scaling_factor 1 / 2.5 / 4; tied and untied.
CONFIGS = {
    "v2lite": ("deepseek_v2", {}),
    "v2": ("deepseek_v2", dict(
        q_lora_rank=256, n_routed_experts=12, num_experts_per_tok=3, n_group=4, topk_group=2,
        topk_method="group_limited_greedy", n_shared_experts=1, routed_scaling_factor=4.0,
        first_k_dense_replace=0, num_hidden_layers=2, qk_rope_head_dim=32, qk_nope_head_dim=48,
        yarn_factor=0)),
    "v3": ("deepseek_v3", {}),
    "v3_noq": ("deepseek_v3", dict(
        q_lora_rank=None, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
        n_shared_experts=2, first_k_dense_replace=2, num_hidden_layers=4, qk_rope_head_dim=8,
        yarn_factor=8.0, yarn_orig_ctx=8, yarn_mscale=None,
        tie_word_embeddings=True)),
}
NAMES = list(CONFIGS)
# outtype -> (ggml types the file must hold, so it cannot pass as a secretly-f32 file; the least
# median correlation of its logits with the f32 file's)
QUANT = {"q8_0": ({"Q8_0"}, 0.999), "q4_k_m": ({"Q4_K", "Q6_K"}, 0.8)}


@pytest.fixture(scope="module")
def fx(fixture_paths):
    def get(name: str, outtype: str = "f32"):
        arch, ov = CONFIGS[name]
        return fixture_paths(arch, outtype, **ov)
    return get


@pytest.fixture(scope="module")
def ref(reference_for):
    def get(name: str):
        arch, ov = CONFIGS[name]
        return reference_for(arch, **ov)
    return get


@pytest.fixture(scope="module")
def hf(hf_for):
    def get(name: str):
        arch, ov = CONFIGS[name]
        return hf_for(arch, **ov)
    return get


# -- configuration --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_config_matches_transformers(name, ref, hf):
    import math

    c, model = ref(name).config, hf(name)
    h, e = model.config, ref(name).config.extra
    assert c.arch == "deepseek2"
    assert (c.n_layers, c.n_embd, c.n_ff, c.n_head) == (
        h.num_hidden_layers, h.hidden_size, h.intermediate_size, h.num_attention_heads)
    assert (e["q_lora_rank"] or None) == h.q_lora_rank  # no q_lora decided from the file
    assert (e["kv_lora_rank"], e["qk_nope"], e["qk_rope"], e["v_head_dim"]) == (
        h.kv_lora_rank, h.qk_nope_head_dim, h.qk_rope_head_dim, h.v_head_dim)
    assert (c.n_head_kv, c.head_dim, c.head_dim_v) == (1, h.kv_lora_rank + h.qk_rope_head_dim, h.kv_lora_rank)
    assert (e["n_expert"], e["n_expert_used"], e["n_expert_shared"], e["n_ff_exp"]) == (
        h.n_routed_experts, h.num_experts_per_tok, h.n_shared_experts, h.moe_intermediate_size)
    assert e["n_dense_lead"] == h.first_k_dense_replace
    assert (e["n_group"], e["n_group_used"]) == (h.n_group, h.topk_group)
    assert e["gating"] == h.scoring_func
    assert e["weights_norm"] == bool(h.norm_topk_prob)
    assert e["weights_scale"] == pytest.approx(h.routed_scaling_factor)
    assert c.tied_embeddings == h.tie_word_embeddings
    assert c.rope_theta == h.rope_parameters["rope_theta"]
    attn = model.model.layers[0].self_attn
    assert e["kq_scale"] == pytest.approx(attn.scaling, rel=1e-6)  # mscale_all_dim through the file
    assert e["rope_attn_factor"] == pytest.approx(model.model.rotary_emb.attention_scaling, rel=1e-6)
    rp = h.rope_parameters
    if rp["rope_type"] == "yarn":
        assert (e["rope_scaling"], e["rope_factor"], e["yarn_orig_ctx"]) == (
            "yarn", rp["factor"], rp["original_max_position_embeddings"])
        # with mscale_all_dim the softmax scale is not plain 1/sqrt(qk_head_dim)
        scaled = not math.isclose(e["kq_scale"] * math.sqrt(e["qk_nope"] + e["qk_rope"]), 1.0)
        assert scaled == ("mscale_all_dim" in rp)
    else:
        assert e["rope_scaling"] == "none"


def test_config_reads_the_file_not_the_layer_count(ref):
    """q_lora, gating, MTP blocks and malformed files are decided from the file's keys and
    tensors, with one-line errors naming what is wrong."""
    import copy

    from reflex_runtime.errors import ModelFileError, UnsupportedModelError
    from reflex_runtime.families import read_config

    def edited(name, drop_keys=(), drop_tensors=(), **keys):
        g = copy.copy(ref(name).gguf)
        g.metadata = {k: v for k, v in g.metadata.items() if k not in drop_keys}
        g.metadata.update({f"deepseek2.{k}": v for k, v in keys.items()})
        g.tensors = {k: v for k, v in g.tensors.items() if k not in drop_tensors}
        return g

    def one_line_error(exc, g, *needles):
        with pytest.raises(exc) as e:
            read_config(g)
        msg = str(e.value)
        assert "\n" not in msg and all(n in msg for n in needles), msg

    # a q_lora_rank key without the q_a tensors, and the q_a tensors without attn_q
    one_line_error(ModelFileError, edited("v2lite", **{"attention.q_lora_rank": 64}), "blk.0.attn_q_a.weight")
    one_line_error(ModelFileError, edited("v3", drop_keys=("deepseek2.attention.q_lora_rank",)), "blk.0.attn_q.weight")
    # 27 layers made V2-Lite for llama.cpp; here only the file counts
    assert read_config(edited("v3", block_count=27, nextn_predict_layers=24)).extra["q_lora_rank"] == 256
    # no expert_gating_func key: softmax (what the converter's missing scoring_func means)
    cfg = read_config(edited("v3", drop_keys=("deepseek2.expert_gating_func",)))
    assert (cfg.extra["gating"], cfg.extra["group_score"]) == ("softmax", "max")
    one_line_error(UnsupportedModelError, edited("v3", expert_gating_func=4), "expert_gating_func 4")
    # trailing NextN blocks are not run
    assert read_config(edited("v3", block_count=4, nextn_predict_layers=1)).n_layers == 3
    one_line_error(UnsupportedModelError, edited("v3", **{"attention.temperature_scale": 0.1}), "temperature")
    one_line_error(ModelFileError, edited("v3", drop_tensors=("blk.2.exp_probs_b.bias", "blk.2.attn_v_b.weight")),
                   "blk.2.attn_v_b.weight")
    one_line_error(ModelFileError, edited("v3", expert_group_used_count=5), "groups")
    one_line_error(UnsupportedModelError, edited("v3", **{"rope.scaling.type": "longrope"}), "longrope")


# -- logits against transformers -------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_f32_logits_match_transformers(name, ref, hf):
    r = ref(name)
    ids = prompt(32)  # YaRN's original context is 8 or 16 here: the prompt crosses it
    got = r.forward(ids, r.new_cache(32))
    want = hf_logits(hf(name), ids)
    assert got.dtype == np.float32 and got.shape == want.shape
    err = rel_err(got, want)
    assert err.max() < TOL, f"{name}: relative error per position {err}"


@pytest.mark.parametrize("name", NAMES)
def test_greedy_decode_matches_generate(name, ref, hf):
    r, model = ref(name), hf(name)
    assert_greedy_matches_generate(r, model, prompt(12, seed=3), label=name)


def test_the_fixtures_exercise_each_feature(ref, hf):
    """Each feature changes the logits well beyond TOL on these fixtures, so the agreement above
    is evidence that it is implemented, not that it is inert: V3's exp_probs_b, group-limited
    routing (V2 and V3), YaRN frequencies and the mscale in kq_scale / cos-sin."""
    import math
    from dataclasses import replace

    from reflex_runtime.families import load_reference

    ids = prompt(32)

    def err_with(name, hide=(), **changes):
        r = ref(name)
        m = load_reference(r.gguf, replace(r.config, extra=dict(r.config.extra, **changes)))
        m.w = _Hidden(r.w, hide)  # the weights already dequantized, minus `hide`
        return rel_err(m.forward(ids, m.new_cache(32)), hf_logits(hf(name), ids)).max()

    r = ref("v3")
    bias = [f"blk.{i}.exp_probs_b.bias" for i in range(1, r.config.n_layers)]
    assert np.abs(r.w.get(bias[0])).max() > 0.05
    assert err_with("v3", hide=bias) > 1e-2, "exp_probs_b does not matter on the v3 fixture"
    assert err_with("v3", n_group=1) > 1e-2
    assert err_with("v2", n_group=1) > 1e-2
    assert err_with("v2", group_score="top2") > 1e-2  # llama.cpp's group rule is not V2's
    assert err_with("v2lite", rope_scaling="none") > 1e-2
    assert err_with("v2lite", kq_scale=1 / math.sqrt(32 + 16)) > 1e-2
    assert err_with("v3", kq_scale=1 / math.sqrt(32 + 16)) > 1e-2
    e = ref("v3_noq").config.extra
    assert e["rope_attn_factor"] > 1.01 and err_with("v3_noq", rope_attn_factor=1.0) > 1e-3


class _Hidden:
    """A Weights view without some tensors."""

    def __init__(self, w, hide):
        self.w, self.hide = w, set(hide)

    def __contains__(self, name):
        return name not in self.hide and name in self.w

    def get(self, name):
        assert name not in self.hide
        return self.w.get(name)

    def expert(self, name, xid):
        assert name not in self.hide
        return self.w.expert(name, xid)

    def rows(self, name, ids):
        return self.w.rows(name, ids)


# -- the older single attn_kv_b layout ------------------------------------------------------------


def test_legacy_kv_b_file_matches_split_file_and_transformers(fx, ref, hf, tmp_path):
    from fixtures.deepseek import hf_deepseek_from_gguf, write_legacy_kv_b

    from reflex_runtime.modelfile.gguf_file import GGUFFile
    from reflex_runtime.families import load_reference

    name = "v3_noq"  # tied: the smallest file
    legacy = tmp_path / "legacy.gguf"
    write_legacy_kv_b(fx(name).gguf, legacy)
    g = GGUFFile(str(legacy))
    assert "blk.0.attn_kv_b.weight" in g.tensors and "blk.0.attn_k_b.weight" not in g.tensors
    assert g.arch_get("attention.key_length_mla") is None
    model = hf(name)
    h = model.config
    assert g.arch_get("attention.key_length") == h.qk_nope_head_dim + h.qk_rope_head_dim
    old = load_reference(g)
    assert not old.config.extra["kv_b_split"]
    assert old.config.extra == dict(ref(name).config.extra, kv_b_split=False)
    # the merge is exactly HF's kv_b_proj
    import torch

    kv_b = old.w.get("blk.1.attn_kv_b.weight")
    assert np.array_equal(kv_b, model.model.layers[1].self_attn.kv_b_proj.weight.detach().numpy())
    ids = prompt(24, seed=5)
    got = old.forward(ids, old.new_cache(24))
    assert rel_err(got, ref(name).forward(ids, ref(name).new_cache(24))).max() < 1e-5
    assert rel_err(got, hf_logits(model, ids)).max() < TOL
    # and the way back into transformers reads it too
    back = hf_deepseek_from_gguf(legacy, fx(name).hf_dir)
    with torch.no_grad():
        assert torch.equal(back.model.layers[2].self_attn.kv_b_proj.weight, model.model.layers[2].self_attn.kv_b_proj.weight)


# -- quantized files ------------------------------------------------------------------------------


@pytest.mark.parametrize("outtype", list(QUANT))
def test_quantized_file_matches_dequantized_transformers(outtype, fx, ref):
    from fixtures.deepseek import hf_deepseek_from_gguf

    from reflex_runtime.modelfile.ggml_types import GGML_TYPES
    from reflex_runtime.families import load_reference

    name = "v3"
    f = fx(name, outtype)
    r = load_reference(f.gguf)
    types = {GGML_TYPES[t.ggml_type].name for t in r.gguf.tensors.values()}
    want_types, min_corr = QUANT[outtype]
    assert want_types <= types, f"{f.gguf} has {types}"
    ids = prompt(16, seed=11)
    got = r.forward(ids, r.new_cache(16))
    err = rel_err(got, hf_logits(hf_deepseek_from_gguf(f.gguf, f.hf_dir), ids))
    assert err.max() < TOL, f"{outtype}: relative error per position {err}"
    # And the quantized model still tracks the f32 one (catches a quantizer that writes garbage
    # both sides would read the same way). The median over positions: weight noise may flip one
    # near-tied top-k choice at a position (measured: q8_0 one position at 0.94-0.96, the
    # others >= 0.999; q4_k_m 0.86-0.97).
    full = ref(name).forward(ids, ref(name).new_cache(16))
    corr = np.median([np.corrcoef(got[i], full[i])[0, 1] for i in range(len(ids))])
    assert corr > min_corr, f"{outtype}: median correlation with f32 logits {corr}"


# -- the forward contract ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["v2lite", "v3"])
def test_prefill_equals_token_by_token(name, ref):
    r = ref(name)
    ids = prompt(20, seed=5)
    once = r.forward(ids, r.new_cache(20))
    cache = r.new_cache(20)
    steps = np.concatenate([r.forward([t], cache) for t in ids])
    assert cache.length == 20
    assert rel_err(steps, once).max() < 1e-5
    cache = r.new_cache(20)
    chunks = np.concatenate([r.forward(ids[:7], cache), r.forward(ids[7:], cache)])
    assert rel_err(chunks, once).max() < 1e-5


@pytest.mark.parametrize("name", ["v2", "v3_noq"])
def test_tree_mask_and_cache_copy(name, ref):
    r = ref(name)
    assert r.supports_tree_mask
    ids = prompt(15, seed=9)
    p, a, b = ids[:6], ids[6:11], ids[11:]
    sep_a = r.forward(np.r_[p, a], r.new_cache(11))
    sep_b = r.forward(np.r_[p, b], r.new_cache(10))
    n = 15
    pos, mask = tree_6_5_4()
    one = r.forward(ids, r.new_cache(n), positions=pos, mask=mask)
    assert rel_err(one[:11], sep_a).max() < 1e-5
    assert rel_err(one[11:], sep_b[6:]).max() < 1e-5
    # the latent cache forks and truncates
    cache = r.new_cache(16)
    r.forward(p, cache)
    assert cache.k[0].shape[1:] == (1, r.config.head_dim)  # one latent row per token
    fork = cache.copy()
    r.forward(a, cache)
    assert rel_err(r.forward(b, fork), sep_b[6:]).max() < 1e-5
    cache.truncate(6)
    assert rel_err(r.forward(b, cache), sep_b[6:]).max() < 1e-5


# -- the CLI and system1 on the CPU ------------------------------------------------------------------


def test_cli_generate_runs_and_matches_transformers(fx, hf):
    import torch

    from reflex_runtime.text.tokenizer import Tokenizer
    from reflex_runtime.modelfile.gguf_file import GGUFFile

    name = "v2lite"
    path = fx(name).gguf
    text = "The capital of France is"
    r = subprocess.run([sys.executable, "-m", "reflex_runtime.cli", "generate", text, "--model", str(path),
                        "--backend", "cpu", "-n", "8", "--ignore-eos", "--json"],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"), timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    tok = Tokenizer.from_gguf(GGUFFile(str(path)))
    ids = tok.encode(text)
    with torch.no_grad():
        seq = hf(name).generate(torch.as_tensor([ids]), max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert out["text"] == tok.decode(seq[0, len(ids):].tolist())
    assert out["finish_reason"] == "length"


@pytest.mark.parametrize("name", ["v2", "v3"])
def test_system1_scores_equal_transformers(name, fx, hf):
    import torch

    from reflex_runtime.loader import load_engine

    eng = load_engine(str(fx(name).gguf), "cpu", log=lambda m: None)
    cands = [" Paris", " London", " the city of lights", " Paris"]
    res = eng.system1(prompt="The capital of France is", candidates=cands)
    p_ids = eng.prompt_ids("The capital of France is")
    for c in res["candidates"]:
        ids = torch.tensor([list(p_ids) + list(c["token_ids"])])
        with torch.no_grad():
            logp = torch.log_softmax(hf(name)(ids).logits[0].double(), dim=-1)
        want = sum(float(logp[len(p_ids) - 1 + j, t]) for j, t in enumerate(c["token_ids"]))
        assert abs(c["score"] - want) <= TOL * max(1.0, abs(want)), (c["text"], c["score"], want)
    assert res["candidates"][0]["score"] == res["candidates"][3]["score"]
    assert len(res["candidates"][2]["token_ids"]) > 1
