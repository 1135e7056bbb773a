"""scripts/gguf_skeleton.py: a file rebuilt from a header alone has the same shapes, types,
offsets and tokenizer, and finite random weights."""

import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "gguf_skeleton.py")


def test_take_then_fill_keeps_the_shape_and_makes_finite_weights(tmp_path, fixture_paths):
    from reflex_runtime.families import load_reference, read_config
    from reflex_runtime.modelfile.gguf_file import GGUFFile
    from reflex_runtime.text.tokenizer import Tokenizer

    src = fixture_paths("qwen3", "q4_k_m").gguf
    skel, out = tmp_path / "m.skel", tmp_path / "m.gguf"
    for args in (["take", str(src), str(skel)], ["fill", str(skel), str(out)]):
        subprocess.run([sys.executable, SCRIPT, *args], check=True, capture_output=True)
    a, b = GGUFFile(str(src)), GGUFFile(str(out))
    assert os.path.getsize(skel) < a.data_offset + 64 < b.size == a.size
    assert [(t.name, t.shape, t.ggml_type, t.offset) for t in a.tensors.values()] == \
        [(t.name, t.shape, t.ggml_type, t.offset) for t in b.tensors.values()]
    assert read_config(a) == read_config(b)
    assert Tokenizer.from_gguf(a).encode("Paris, France") == Tokenizer.from_gguf(b).encode("Paris, France")
    logits = load_reference(b).forward([1, 2, 3], load_reference(b).new_cache(8))
    assert np.isfinite(logits).all() and logits.std() > 0
