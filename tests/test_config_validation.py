"""Malformed metadata found by probing main (issue 20), each through the CLI: one line and exit 3
(bad model file) or 4 (unsupported), never IndexError / TypeError / ZeroDivisionError / "math
domain error" / MemoryError (exit 70). The fuzz run (test_gguf_fuzz.py) covers the space; these
are the named regressions."""

from __future__ import annotations

import contextlib
import io
import time

import pytest

from gguf_edit import VT, GGUFModel, shrink_vocab
from reflex_runtime import cli


@pytest.fixture(scope="module")
def models(fixture_paths):
    qwen3 = shrink_vocab(GGUFModel.load(fixture_paths("qwen3", "q4_k_m").gguf), 512)
    gemma3 = GGUFModel.load(fixture_paths("gemma3", "q4_k_m").gguf)
    return {"qwen3": qwen3, "gemma3": gemma3}


def _tokens(m, n):
    return lambda m2: m2.set("tokenizer.ggml.tokens", m.get("tokenizer.ggml.tokens")[:n], VT.ARRAY, VT.STRING)


def _one_d_embedding(m):
    t = m.tensor("token_embd.weight")
    t.dims = [t.dims[0] * t.dims[1]]


def _set(key, value, vtype, etype=None):
    return lambda m: m.set(key, value, vtype, etype)


CASES = {
    "1-D token_embd": ("qwen3", _one_d_embedding, 3, "should be a matrix"),
    "general.file_type as an array": ("qwen3", _set("general.file_type", [7], VT.ARRAY, VT.UINT32), 3,
                                      "'general.file_type' should be an integer, got an array of 1"),
    "tokenizer.ggml.pre as an array": ("qwen3", _set("tokenizer.ggml.pre", ["qwen2"], VT.ARRAY, VT.STRING), 3,
                                       "tokenizer.ggml.pre should be a string"),
    "head_count 0": ("qwen3", _set("qwen3.attention.head_count", 0, VT.UINT32), 3,
                     "'qwen3.attention.head_count' should be an integer in 1..4096, got 0"),
    "key_length 0": ("gemma3", _set("gemma3.attention.key_length", 0, VT.UINT32), 3,
                     "'gemma3.attention.key_length' should be an integer in 1..1048576, got 0"),
    "negative key_length": ("gemma3", _set("gemma3.attention.key_length", -64, VT.INT32), 3, "got -64"),
    "negative head_count_kv": ("qwen3", _set("qwen3.attention.head_count_kv", -1, VT.INT32), 3, "got -1"),
    "float sliding_window_pattern": ("gemma3", _set("gemma3.attention.sliding_window_pattern", 6.0, VT.FLOAT32), 3,
                                     "'gemma3.attention.sliding_window_pattern' should be an integer, got 6.0"),
    "gemma block_count 2^32-1": ("gemma3", _set("gemma3.block_count", 2**32 - 1, VT.UINT32), 3,
                                 "'gemma3.block_count' should be an integer in 1..1024, got 4294967295"),
    "NaN rms epsilon": ("qwen3", _set("qwen3.attention.layer_norm_rms_epsilon", float("nan"), VT.FLOAT32), 3,
                        "should be a finite number"),
    "chat template as an array": ("qwen3", _set("tokenizer.chat_template", ["x"], VT.ARRAY, VT.STRING), 3,
                                  "tokenizer.chat_template should be a string"),
    "non-UTF-8 architecture": ("qwen3", _set("general.architecture", "\udc80qwen3", VT.STRING), 4,
                               "unsupported architecture '\\udc80qwen3'"),
}
for n in (1, 2, 3):
    CASES[f"{n}-token vocabulary (BPE)"] = ("qwen3", None, 3, f"vocabulary has {n} tokens but token_embd.weight has")
    CASES[f"{n}-token vocabulary (SentencePiece)"] = ("gemma3", None, 3, "")


@pytest.mark.parametrize("name", sorted(CASES))
def test_malformed_metadata_is_one_line_and_exit_3_or_4(models, tmp_path, name):
    seed, edit, code, needle = CASES[name]
    m = models[seed].copy()
    if edit is None:
        n = int(name[0])
        edit = _tokens(models[seed], n)
    edit(m)
    path = tmp_path / "bad.gguf"
    path.write_bytes(m.to_bytes()[0])
    err = io.StringIO()
    t0 = time.monotonic()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        got = cli.main(["generate", "hi", "-m", str(path), "--backend", "cpu", "-n", "1"])
    lines = err.getvalue().strip().splitlines()
    assert got == code and len(lines) == 1 and lines[0].startswith("reflex: error: "), (got, err.getvalue())
    assert needle in lines[0], lines[0]
    lines[0].encode("utf-8")  # no raw surrogates
    assert time.monotonic() - t0 < 5
