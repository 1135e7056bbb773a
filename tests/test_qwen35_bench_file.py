"""scripts/make_qwen35_bench.py: Qwen3.5-shaped files written directly (no converter) must look like
the converter's own (--no-nextn: keys, value types, tensor names, shapes, order), read as the
right config, take llama-quantize's Q4_K_M types, decode to weights of the intended scale, run in
the numpy reference, and at the published shapes have the published parameter counts."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest

# The default tiny fixtures of scripts/fixtures/qwen35.py, in the generator's terms.
TINY = dict(hidden=256, layers=4, heads=4, kv_heads=2, head_dim=64, rope_dim=16, k_heads=2, v_heads=4, k_dim=32,
            v_dim=32, conv=4, tied=1, context=4096)
TINY_ARCH = {"qwen35": ("0.8b", dict(TINY, ff=512)),
             "qwen35moe": ("35b-a3b", dict(TINY, experts=8, used=2, expert_ff=256, shared_ff=512))}


@pytest.fixture(scope="module", params=["qwen35", "qwen35moe"])
def tiny(request, fixture_paths, tmp_path_factory):
    """(arch, written Q8_0 file, the converter's --no-nextn Q8_0 file of the same model shape)."""
    from fixtures.qwen35 import convert_variant
    from make_qwen35_bench import write_qwen35_bench

    arch = request.param
    model, shape = TINY_ARCH[arch]
    fx = fixture_paths(arch, "q8_0")
    theirs = convert_variant(fx, "q8_0", "--no-nextn")
    with_vocab = dict(shape, vocab=_vocab(theirs))
    ours = write_qwen35_bench(tmp_path_factory.mktemp(arch) / "bench.gguf", model, "q8_0", template=fx.gguf, seed=1,
                              **with_vocab)
    return arch, ours, theirs


def _vocab(path) -> int:
    from reflex_runtime.modelfile.gguf_file import GGUFFile

    with GGUFFile(path) as g:
        return len(g.get("tokenizer.ggml.tokens"))


def test_keys_match_the_converter(tiny):
    """Same keys, value types and order as the converter's file; tokenizer.* copied verbatim."""
    from quantize_gguf import SourceGGUF

    _, ours, theirs = tiny
    mine, conv = SourceGGUF(ours).metadata, SourceGGUF(theirs).metadata
    assert [m[:3] for m in mine] == [m[:3] for m in conv]
    values = {m[0]: m[3] for m in mine}
    for key, _, _, value in conv:
        if not key.startswith(("general.name", "general.size_label", "general.file_type")):
            assert values[key] == value, key


def test_tensors_match_the_converter(tiny):
    from reflex_runtime.modelfile.gguf_file import GGUFFile

    _, ours, theirs = tiny
    with GGUFFile(ours) as g, GGUFFile(theirs) as t:
        assert list(g.tensors) == list(t.tensors)
        for name, ti in g.tensors.items():
            assert (ti.shape, ti.type_name) == (t.tensors[name].shape, t.tensors[name].type_name), name
        assert g.data_offset % 32 == 0


def test_reads_as_the_config_and_runs_in_the_reference(tiny):
    from reflex_runtime.families import gpu_unsupported, load_reference, read_config
    from reflex_runtime.modelfile.gguf_file import GGUFFile

    arch, ours, theirs = tiny
    with GGUFFile(ours) as g, GGUFFile(theirs) as t:
        mine, conv = read_config(g), read_config(t)
        assert mine.arch == arch and mine.file_type == "Q8_0"
        assert {k: v for k, v in vars(mine).items() if k not in ("name", "file_type")} == \
               {k: v for k, v in vars(conv).items() if k not in ("name", "file_type")}
        assert gpu_unsupported(mine, g) is None
    model = load_reference(str(ours))
    ids = [151643, 9707, 11, 1879, 0, 42, 7, 100]
    logits = model.forward(ids, model.new_cache(16))
    assert logits.shape == (len(ids), mine.vocab_size)
    assert np.all(np.isfinite(logits)) and float(np.std(logits)) > 0


def _deq(g, name):
    import gguf

    ti = g.tensors[name]
    raw = np.frombuffer(g.tensor_data(name), np.uint8)
    return gguf.dequantize(raw, gguf.GGMLQuantizationType(ti.ggml_type)).reshape(-1)


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe"])
def test_q4_k_m_types_and_weight_scale(arch, fixture_paths, tmp_path):
    """llama-quantize's Q4_K_M choices (rows of 256s: no fallbacks), and every type's weights at
    std 0.5/sqrt(row length)."""
    from make_qwen35_bench import write_qwen35_bench

    from reflex_runtime.modelfile.gguf_file import GGUFFile

    model, shape = TINY_ARCH[arch]
    shape = dict(shape, layers=8, v_heads=8, heads=4, tied=0, vocab=152064)  # rows of 256 everywhere; 8 layers
    path = write_qwen35_bench(tmp_path / "q4km.gguf", model, "q4_k_m", template=fixture_paths(arch, "q8_0").gguf,
                              **shape)
    more_bits = {0, 3, 6, 7}  # 8 layers: the first and last eighth, every third in between
    with GGUFFile(path) as g:
        assert g.get("general.file_type") == 15
        for name, ti in g.tensors.items():
            layer = int(name.split(".")[1]) if name.startswith("blk.") else None
            if len(ti.shape) == 1 or "ffn_gate_inp" in name or "ssm_conv1d" in name:
                want = "F32"
            elif name == "output.weight":
                want = "Q6_K"
            elif name.endswith(("attn_v.weight", "attn_qkv.weight")) or ".ffn_down" in name:
                want = "Q6_K" if layer in more_bits else "Q4_K"
            else:
                want = "Q4_K"
            assert ti.type_name == want, name
        for name in ("blk.0.attn_qkv.weight", "blk.1.attn_qkv.weight", "output.weight", "token_embd.weight",
                     "blk.0.ssm_out.weight"):
            k = g.tensors[name].shape[0]
            assert np.std(_deq(g, name)) == pytest.approx(0.5 / math.sqrt(k), rel=0.05), name
        # the token list padded to the vocabulary as the converter pads it
        tokens, types = g.get("tokenizer.ggml.tokens"), g.get("tokenizer.ggml.token_type")
        assert len(tokens) == len(types) == 152064 and tokens[-1] == "[PAD152063]" and types[-1] == 5


def test_fallback_types_for_rows_that_are_not_256s():
    from make_qwen35_bench import q4_k_m_type

    assert q4_k_m_type("blk.0.ssm_out.weight", (128, 256), 4, True) == "Q5_0"
    assert q4_k_m_type("blk.3.ffn_down.weight", (384, 256), 4, True) == "Q8_0"  # a "more bits" layer: Q6_K -> Q8_0
    assert q4_k_m_type("blk.1.ffn_down.weight", (384, 256), 4, True) == "Q5_0"
    assert q4_k_m_type("token_embd.weight", (320, 1000), 4, True) == "Q8_0"


def test_published_shapes_have_the_published_sizes():
    """0.8B: ~0.75B parameters in the text model (the checkpoint's vision tower is the rest);
    35B-A3B: ~35B parameters, ~3B read per token."""
    from make_qwen35_bench import MODELS, tensor_plan

    for model, total, active in (("0.8b", 0.752e9, 0.752e9), ("35b-a3b", 34.66e9, 2.95e9)):
        s = MODELS[model]
        plan = tensor_plan(s, s["layers"], "q8_0")
        n = sum(math.prod(shape) for _, shape, _ in plan)
        act = sum(math.prod(shape) // s["experts"] * s["used"] if "_exps" in name else
                  (shape[0] if name == "token_embd.weight" and not s["tied"] else math.prod(shape))
                  for name, shape, _ in plan)
        assert n == pytest.approx(total, rel=0.005) and act == pytest.approx(active, rel=0.005), model
        assert sum(1 for name, _, _ in plan if name.endswith("attn_q.weight")) == s["layers"] // 4


def test_cli_rejects_bad_values_in_one_line(tmp_path):
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "make_qwen35_bench.py")
    for args, says in ((["--set", "hidden=abc"], "--set hidden wants a whole number"),
                       (["--set", "hidden=100"], "hidden=100 must be a multiple of 32"),
                       (["--set", "foo=1"], "--set wants KEY=VALUE"),
                       (["--layers", "0"], "--layers must be at least 1"),
                       (["--model", "9b"], "invalid choice")):
        out = tmp_path / "x.gguf"
        r = subprocess.run([sys.executable, script, "--out", str(out), *args], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
        assert not out.exists()
