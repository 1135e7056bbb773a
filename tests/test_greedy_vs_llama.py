"""scripts/greedy_vs_llama.py without a GPU: llama-simple's echoed prompt is cut off, and the
comparison reports the common prefix (the reflex side needs the GPU: gpu_run.sh step fidelity)."""

import importlib.util
import os
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "greedy_vs_llama.py"
spec = importlib.util.spec_from_file_location("greedy_vs_llama", SCRIPT)
g = importlib.util.module_from_spec(spec)
spec.loader.exec_module(g)


def _fake_llama(tmp_path, body):
    exe = tmp_path / "llama-simple"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(0o755)
    return str(exe)


def test_llama_simple_continuation_without_the_echoed_prompt(tmp_path):
    exe = _fake_llama(tmp_path, 'printf "%s, and then it rained" "$7"\necho "timings..." >&2\n')
    assert g.llama_simple(exe, "m.gguf", "Once upon a time", 32) == ", and then it rained"


def test_a_failing_llama_simple_is_one_line(tmp_path):
    exe = _fake_llama(tmp_path, 'echo "failed to load model" >&2\nexit 1\n')
    with pytest.raises(SystemExit) as e:
        g.llama_simple(exe, "m.gguf", "p", 4)
    assert "llama-simple failed (1)" in str(e.value) and "failed to load model" in str(e.value)


@pytest.mark.parametrize("a,b,n", [("abc", "abc", 3), ("abcd", "abxd", 2), ("", "x", 0), ("ab", "abc", 2)])
def test_common_prefix(a, b, n):
    assert g.common_prefix(a, b) == n
