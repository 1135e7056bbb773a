"""scripts/reference_vs_llama.py's F32 copy: the tensors named are stored as F32 with the values the
quantized ones decode to, everything else (metadata, other tensors) as it was, and the copy loads."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))


def test_dequantized_copy_keeps_values_and_metadata(tmp_path):
    import gguf
    from fixtures import make_fixture
    from gguf.quants import dequantize
    from reference_vs_llama import dequantized_copy

    from reflex_runtime.loader import load_engine

    src = str(make_fixture("qwen3", "q8_0").gguf)
    dst = str(tmp_path / "copy.gguf")
    assert dequantized_copy(src, dst, ["ffn_down"]) > 0
    a, b = gguf.GGUFReader(src), gguf.GGUFReader(dst)
    ta, tb = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
    assert ta.keys() == tb.keys()
    for name, t in ta.items():
        u = tb[name]
        if "ffn_down" in name:
            assert u.tensor_type == gguf.GGMLQuantizationType.F32
            assert np.array_equal(dequantize(t.data, t.tensor_type).reshape(-1), np.asarray(u.data).reshape(-1))
        else:
            assert u.tensor_type == t.tensor_type and bytes(t.data) == bytes(u.data)
    assert {k for k in a.fields if not k.startswith("GGUF.")} == {k for k in b.fields if not k.startswith("GGUF.")}
    eng_a, eng_b = load_engine(src, backend="cpu"), load_engine(dst, backend="cpu")
    assert eng_a.prompt_ids("The capital of France") == eng_b.prompt_ids("The capital of France")


def test_an_unreadable_llama_server_answer_is_one_line(monkeypatch, capsys):
    """A reply without the fields asked for (an older or newer llama-server) exits 1 with one line."""
    import greedy_vs_llama as G
    from fixtures import make_fixture
    from reference_vs_llama import main

    def no_probs(*a, **k):
        return {"content": "x"}["completion_probabilities"]

    monkeypatch.setattr(G, "llama_server_greedy", no_probs)
    assert main([str(make_fixture("qwen3", "q8_0").gguf), "--llama-server", "/nonexistent", "--prompt-path"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("reference_vs_llama:") and "completion_probabilities" in err and "\n" not in err
