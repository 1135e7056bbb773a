"""scripts/make_moe_bench.py: a tiny random qwen3moe file written directly (no converter) must
look like the converter's own (keys, types, tensor order), load in our config reader, run in the
numpy reference, and report the bytes one decode token reads."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

TINY = dict(hidden=256, experts=8, used=2, expert_ff=256, ff=512, heads=4, kv_heads=2, head_dim=64)
LAYERS = 2


@pytest.fixture(scope="module")
def bench(fixture_paths, tmp_path_factory):
    """(written file, template fixture) for the TINY shape."""
    from make_moe_bench import write_moe_bench

    template = fixture_paths("qwen3moe", "q8_0").gguf
    out = write_moe_bench(tmp_path_factory.mktemp("moe") / "bench.gguf", layers=LAYERS, template=template,
                          seed=1, **TINY)
    return out, template


def q8(shape):  # Q8_0 bytes of a ggml shape
    return math.prod(shape) // 32 * 34


def test_config_and_tensor_types(bench):
    from reflex_runtime.modelfile.gguf_file import GGUFFile
    from reflex_runtime.families import read_config

    path, template = bench
    with GGUFFile(path) as g, GGUFFile(template) as t:
        cfg = read_config(g)
        vocab = len(t.get("tokenizer.ggml.tokens"))
        assert (cfg.arch, cfg.n_layers, cfg.n_embd, cfg.vocab_size) == ("qwen3moe", LAYERS, 256, vocab)
        assert (cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v) == (4, 2, 64, 64)
        assert cfg.extra["n_expert"] == 8 and cfg.extra["n_expert_used"] == 2 and cfg.extra["n_ff_exp"] == 256
        assert not cfg.tied_embeddings and cfg.context_length == 40960 and cfg.file_type == "Q8_0"
        # same tensor names in the same order as the converter-made fixture of the same depth
        assert list(g.tensors) == list(t.tensors)
        for ti in g.tensors.values():
            f32 = ti.name.endswith(("norm.weight", "ffn_gate_inp.weight"))
            assert ti.type_name == ("F32" if f32 else "Q8_0"), ti.name
        assert g.tensors["blk.1.ffn_down_exps.weight"].shape == (256, 256, 8)
        assert g.tensors["blk.1.ffn_gate_inp.weight"].shape == (256, 8)
        assert g.data_offset % 32 == 0 and g.alignment == 32


def test_keys_match_the_converter(bench):
    """Same keys, value types and order as the fixture; tokenizer.* values copied verbatim."""
    from quantize_gguf import SourceGGUF

    path, template = bench
    ours, theirs = SourceGGUF(path).metadata, SourceGGUF(template).metadata
    assert [m[:3] for m in ours] == [m[:3] for m in theirs]
    tok = [m for m in theirs if m[0].startswith("tokenizer.")]
    assert tok and [m for m in ours if m[0].startswith("tokenizer.")] == tok


def test_weight_scale_and_norms(bench):
    import gguf

    from reflex_runtime.modelfile.gguf_file import GGUFFile

    path, _ = bench
    with GGUFFile(path) as g:
        def deq(name):
            ti = g.tensors[name]
            raw = np.frombuffer(g.tensor_data(name), np.uint8)
            return gguf.dequantize(raw, gguf.GGMLQuantizationType(ti.ggml_type)).reshape(-1)

        for name, k in [("blk.0.ffn_gate_exps.weight", 256), ("blk.0.ffn_down_exps.weight", 256),
                        ("blk.1.attn_output.weight", 256), ("output.weight", 256)]:
            assert np.std(deq(name)) == pytest.approx(0.5 / math.sqrt(k), rel=0.05), name
        assert np.all(deq("blk.0.attn_q_norm.weight") == 1) and np.all(deq("output_norm.weight") == 1)
        assert np.std(deq("blk.0.ffn_gate_inp.weight")) == pytest.approx(4 / 16, rel=0.1)
        # experts are not copies of each other (the random pool is not aligned to an expert)
        gate = deq("blk.0.ffn_gate_exps.weight").reshape(8, -1)
        assert not np.array_equal(gate[0], gate[1])


def test_reference_forward_is_finite(bench):
    from reflex_runtime.families import load_reference

    path, _ = bench
    model = load_reference(str(path))
    ids = [151643, 9707, 11, 1879, 0]
    logits = model.forward(ids, model.new_cache(16))
    assert logits.shape == (len(ids), model.config.vocab_size)
    assert np.all(np.isfinite(logits)) and float(np.std(logits)) > 0


def test_active_bytes_per_token(bench):
    from make_moe_bench import active_bytes_per_token

    path, template = bench
    from reflex_runtime.modelfile.gguf_file import GGUFFile

    with GGUFFile(template) as t:
        vocab = len(t.get("tokenizer.ggml.tokens"))
    e, hd, n_exp, used, ff_exp = 256, 64, 8, 2, 256
    attn = q8((e, 4 * hd)) + 2 * q8((e, 2 * hd)) + q8((4 * hd, e))
    norms = 4 * (2 * e + 2 * hd)
    router = 4 * e * n_exp
    experts = 3 * q8((e, ff_exp, n_exp)) // n_exp * used
    per_layer = attn + norms + router + experts
    want = LAYERS * per_layer + q8((e, 1)) + q8((e, vocab)) + 4 * e  # token row, LM head, output_norm
    assert active_bytes_per_token(path) == want


def test_cli_rejects_bad_values_in_one_line(tmp_path):
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "make_moe_bench.py")
    for args, says in ((["--set", "hidden=abc"], "--set hidden wants a whole number"),
                       (["--set", "experts=0"], "--set experts must be positive"),
                       (["--set", "foo=1"], "--set wants KEY=VALUE"),
                       (["--layers", "0"], "--layers must be at least 1")):
        out = tmp_path / "x.gguf"
        r = subprocess.run([sys.executable, script, "--out", str(out), *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
        assert not out.exists()
