"""scripts/make_deepseek_bench.py: a DeepSeek-V2-Lite-shaped deepseek2 file written directly (no
converter) must carry the converter's keys and tensors, parse into the right config (the engine's
and the CUDA engine's checks included), hold the types llama.cpp's Q4_K_M recipe gives, run in the
numpy reference; and the full default shape must be V2-Lite's (15.7B parameters)."""

from __future__ import annotations

import math

import numpy as np
import pytest

TINY = dict(hidden=256, heads=4, kv_lora=128, rope=16, nope=32, v_head=64, experts=8, used=2, shared=2,
            expert_ff=256, ff=512)
LAYERS = 3  # the first dense, like the converter-made V2-Lite fixture


@pytest.fixture(scope="module", params=["Q8_0", "Q4_K_M"])
def bench(request, tmp_path_factory):
    from make_deepseek_bench import write_deepseek_bench

    out = tmp_path_factory.mktemp("ds") / f"bench-{request.param}.gguf"
    return write_deepseek_bench(out, request.param, layers=LAYERS, seed=1, **TINY), request.param


def test_config(bench):
    from reflex_runtime.families import gpu_unsupported, read_config
    from reflex_runtime.modelfile.gguf_file import GGUFFile

    path, type_name = bench
    with GGUFFile(path) as g:
        c = read_config(g)
        e = c.extra
        assert (c.arch, c.n_layers, c.n_embd, c.n_ff, c.n_head, c.vocab_size) == ("deepseek2", LAYERS, 256, 512, 4, 102400)
        assert (c.n_head_kv, c.head_dim, c.head_dim_v, c.context_length) == (1, 128 + 16, 128, 163840)
        assert (e["q_lora_rank"], e["kv_lora_rank"], e["qk_nope"], e["qk_rope"], e["v_head_dim"]) == (0, 128, 32, 16, 64)
        assert e["kv_b_split"] and e["n_dense_lead"] == 1
        assert (e["n_expert"], e["n_expert_used"], e["n_expert_shared"], e["n_ff_exp"]) == (8, 2, 2, 256)
        assert (e["gating"], e["n_group"], e["weights_norm"], e["weights_scale"]) == ("softmax", 1, False, 1.0)
        assert (e["rope_scaling"], e["rope_factor"], e["yarn_orig_ctx"]) == ("yarn", 40.0, 4096)
        # V2-Lite's mscale_all_dim 0.707 through yarn_log_multiplier: kq_scale = m^2 / sqrt(48)
        m = 0.1 * 0.707 * math.log(40.0) + 1.0
        assert e["kq_scale"] == pytest.approx(m * m / math.sqrt(48), rel=1e-6) and e["rope_attn_factor"] == 1.0
        assert c.file_type == type_name and not c.tied_embeddings
        assert g.get("tokenizer.ggml.pre") == "deepseek-llm" and g.get("tokenizer.ggml.bos_token_id") == 100000
        assert gpu_unsupported(c, g) is None


def test_keys_and_tensors_match_the_converter(bench, fixture_paths):
    """Same non-tokenizer keys (names, value types, order) and tensor names in the same order as
    the converter's own V2-Lite-like fixture of the same depth."""
    from quantize_gguf import SourceGGUF

    from reflex_runtime.modelfile.gguf_file import GGUFFile

    path, _ = bench
    ref = fixture_paths("deepseek_v2", "q8_0").gguf
    ours = [m[:3] for m in SourceGGUF(path).metadata if not m[0].startswith("tokenizer.")]
    theirs = [m[:3] for m in SourceGGUF(ref).metadata if not m[0].startswith("tokenizer.")]
    assert ours == theirs
    with GGUFFile(path) as g, GGUFFile(ref) as t:
        assert list(g.tensors) == list(t.tensors)
        assert g.tensors["blk.1.attn_k_b.weight"].shape == (32, 128, 4)
        assert g.tensors["blk.1.ffn_down_exps.weight"].shape == (256, 256, 8)


def test_types_follow_llama_cpp(bench):
    from make_deepseek_bench import more_bits

    from reflex_runtime.modelfile.gguf_file import GGUFFile

    path, type_name = bench
    with GGUFFile(path) as g:
        types = {n: ti.type_name for n, ti in g.tensors.items()}
    for name, t in types.items():
        if name.endswith(("norm.weight", "ffn_gate_inp.weight")):
            assert t == "F32", name
        elif type_name == "Q8_0":
            assert t == "Q8_0", name
    if type_name == "Q4_K_M":
        assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == "Q4_K"
        assert types["blk.1.attn_k_b.weight"] == "Q5_0"  # rows of 32: Q4_K falls back
        assert types["blk.1.attn_v_b.weight"] == "Q5_0"  # rows of kv_lora_rank 128 here (512 in V2-Lite: Q4_K)
        assert types["blk.1.attn_q.weight"] == types["blk.1.ffn_gate_exps.weight"] == "Q4_K"
        for il in range(1, LAYERS):  # 3 layers: 3 // 8 = 0, 7 * 3 // 8 = 2: layer 2 gets more bits
            want = "Q6_K" if more_bits(il, LAYERS) else "Q4_K"
            assert types[f"blk.{il}.ffn_down_exps.weight"] == want
        assert types["blk.0.ffn_down.weight"] == ("Q6_K" if more_bits(0, LAYERS) else "Q4_K")


def test_weights_scale_and_reference_forward(bench):
    import gguf

    from reflex_runtime.families import load_reference
    from reflex_runtime.modelfile.gguf_file import GGUFFile

    path, _ = bench
    with GGUFFile(path) as g:
        for name in ("blk.1.ffn_gate_exps.weight", "blk.1.ffn_down_exps.weight", "blk.2.attn_q.weight",
                     "blk.0.attn_k_b.weight", "output.weight"):
            ti = g.tensors[name]
            vals = gguf.dequantize(np.frombuffer(g.tensor_data(name), np.uint8), gguf.GGMLQuantizationType(ti.ggml_type))
            assert np.std(vals) == pytest.approx(0.5 / math.sqrt(ti.shape[0]), rel=0.1), name
    model = load_reference(str(path))
    ids = [100000, 1234, 56, 7890, 13]
    logits = model.forward(ids, model.new_cache(16))
    assert logits.shape == (len(ids), 102400) and np.all(np.isfinite(logits)) and float(np.std(logits)) > 0


def test_default_shape_is_deepseek_v2_lite():
    """27 layers of V2-Lite's shapes: 15.7B parameters (the model card's total), 10.4 / 16.7 GB
    in Q4_K_M / Q8_0; and its KV cache per token, latent against expanded."""
    from types import SimpleNamespace

    from make_deepseek_bench import DEFAULT_SHAPE, _BLOCKS, _nbytes, tensor_plan

    from reflex_runtime.families.deepseek2.config import kv_cache_bytes_per_token

    sizes = {}
    for t in ("Q8_0", "Q4_K_M"):
        plan = tensor_plan(27, 102400, DEFAULT_SHAPE, t)
        assert sum(math.prod(s) for _, s, _ in plan) == pytest.approx(15.7e9, rel=0.005)
        sizes[t] = sum(_nbytes(k, s) if k in _BLOCKS else 4 * math.prod(s) for _, s, k in plan)
    assert sizes["Q8_0"] == pytest.approx(16.70e9, rel=0.01) and sizes["Q4_K_M"] == pytest.approx(10.36e9, rel=0.01)
    cfg = SimpleNamespace(n_layers=27, n_head=16, extra=dict(kv_lora_rank=512, qk_rope=64, qk_nope=128, v_head_dim=128))
    kv = kv_cache_bytes_per_token(cfg)
    assert (kv["latent"], kv["expanded"]) == (27 * 576 * 2, 27 * 16 * (128 + 64 + 128) * 2)  # 31,104 vs 276,480


def test_cli_rejects_bad_values_in_one_line(tmp_path):
    import os
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "make_deepseek_bench.py")
    for args, says in ((["--set", "hidden=abc"], "--set hidden wants a whole number"),
                       (["--set", "experts=0"], "--set experts must be positive"),
                       (["--set", "foo=1"], "--set wants KEY=VALUE"),
                       (["--type", "Q5_K"], "invalid choice"),
                       (["--set", "hidden=100"], "must be a multiple of 32"),
                       (["--layers", "0"], "--layers must be at least 1")):
        out = tmp_path / "x.gguf"
        r = subprocess.run([sys.executable, script, "--out", str(out), *args], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
        assert not out.exists()
