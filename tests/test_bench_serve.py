"""scripts/bench_serve.py against a real `reflex serve` on the CPU backend and the smallest fixture
(the 2-layer tied Llama, 5 MB): correctness of what it reports, not timings."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEVEL_FIELDS = {"clients", "requests", "tokens", "wall_s", "tok_s", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s",
                "latency_p50_s", "failures", "joules", "joules_per_token"}


@pytest.mark.slow
def test_bench_serve_answers_every_request_with_exactly_the_asked_tokens(fixture_paths, tmp_path):
    # OPENBLAS_NUM_THREADS=1: spinning BLAS threads on a 2-core machine hold the server's writes ~0.1 s
    model = str(fixture_paths("llama", "f32", tie_word_embeddings=True).gguf)
    out, compare = tmp_path / "serve.json", tmp_path / "compare.json"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_serve.py"), "--model", model,
                        "--backend", "cpu", "--clients", "1,2", "--requests-per-client", "1", "--prompt-tokens", "8",
                        "--answer-tokens", "4", "--targets", "reflex", "--timeout", "60", "--out", str(out),
                        "--compare-out", str(compare)],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": ROOT, "OPENBLAS_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["model_file"] == os.path.basename(model) and res["date"]
    reflex = res["targets"]["reflex"]
    assert set(res["targets"]) == {"reflex"} and "serve" in reflex["command"]
    assert [lv["clients"] for lv in reflex["levels"]] == [1, 2]
    for lv in reflex["levels"]:
        assert LEVEL_FIELDS <= set(lv), LEVEL_FIELDS - set(lv)
        assert lv["failures"] == 0, lv["failure_examples"]
        assert lv["requests"] == lv["clients"] and lv["tokens"] == 4 * lv["clients"]  # every answer exactly 4 tokens
        assert lv["tok_s"] > 0 and lv["wall_s"] > 0 and 0 < lv["ttft_p50_s"] <= lv["ttft_p99_s"]
        assert 0 < lv["ttft_p50_s"] <= lv["latency_p50_s"] and 0 <= lv["itl_p50_s"] <= lv["itl_p99_s"]
        # no NVML (the CPU machine): no joules, and a note says why
        assert (lv["joules"] is None and lv["joules_per_token"] is None) == ("energy_note" in reflex)
    assert not compare.exists()  # one target: nothing to compare
    # the server it spawned is gone: its port refuses connections
    port = int(reflex["command"].split("--port ")[1].split()[0])
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass
