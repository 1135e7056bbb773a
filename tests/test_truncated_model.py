"""A model file truncated while a long-lived process has it open: the process survives.

Protection (docs/INTERNALS.md "GGUF"): after loading, the runtime never reads the file mapping
(the loader unmaps it; GPU weights went up through preadv; the CPU reference reads tensors with
pread into private copies). Weights already read keep serving; a read the truncated file cannot
satisfy is a ModelFileError, answered as an error. Before this, the reference kept float32
tensors as views of the mapping, and the next request after a truncation killed `serve` with
SIGBUS."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from reflex_runtime.errors import ModelFileError
from reflex_runtime.modelfile.gguf_file import GGUFFile

CHAT = {"messages": [{"role": "user", "content": "Name one color."}], "max_tokens": 2, "temperature": 0}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(port: int, method: str, path: str, body: dict | None = None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request(method, path, body=json.dumps(body).encode() if body is not None else None,
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


@pytest.fixture
def served_copy(fixture_paths, tmp_path):
    """`reflex serve --backend cpu` on a private copy of the f32 Gemma 3 fixture (f32: the
    tensors the reference used to keep as views of the mapping)."""
    path = tmp_path / "model.gguf"
    shutil.copyfile(fixture_paths("gemma3", "f32").gguf, path)
    port = _free_port()
    log = open(tmp_path / "serve.log", "w+b")
    env = {**os.environ, "REFLEX_NO_INDEX": "1"}
    p = subprocess.Popen([sys.executable, "-m", "reflex_runtime.cli", "serve", "--backend", "cpu", "--port", str(port),
                          "-m", str(path)], stdout=subprocess.DEVNULL, stderr=log, env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert p.poll() is None, "serve exited"
            try:
                if _request(port, "GET", "/healthz")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "serve did not become healthy"
            time.sleep(0.1)
        yield path, port, p, log
    finally:
        p.terminate()
        p.wait(10)
        log.close()


def _data_offset(path) -> int:
    with GGUFFile(path) as g:
        return g.data_offset


def test_truncated_after_weights_were_read_keeps_serving(served_copy):
    path, port, p, log = served_copy
    status, first = _request(port, "POST", "/v1/chat/completions", CHAT)
    assert status == 200, first
    os.truncate(path, _data_offset(path) + 4096)  # the weights are gone from the file
    for _ in range(2):
        status, body = _request(port, "POST", "/v1/chat/completions", CHAT)
        assert status == 200, body  # served from the weights already in memory
        assert json.loads(body)["choices"][0]["message"] == json.loads(first)["choices"][0]["message"]
    assert p.poll() is None


def test_truncated_before_weights_were_read_answers_an_error_and_survives(served_copy):
    path, port, p, log = served_copy
    os.truncate(path, _data_offset(path) + 4096)  # loaded (lazily), nothing read yet
    for _ in range(2):
        status, body = _request(port, "POST", "/v1/chat/completions", CHAT)
        assert status == 503, body
        message = json.loads(body)["error"]["message"]
        assert "shorter than when it was opened" in message and "\n" not in message, message
    assert _request(port, "GET", "/v1/models")[0] == 200
    # health says what requests get (issue 30: it answered 200 here)
    status, body = _request(port, "GET", "/healthz")
    err = json.loads(body)["error"]
    assert (status, err["code"], err["type"]) == (503, "engine_failed", "model_file_error"), body
    assert err["message"].startswith("the engine failed its last request: model file")
    assert p.poll() is None


def test_reads_after_truncation_are_model_file_errors(fixture_paths, tmp_path):
    from reflex_runtime.families import load_reference

    path = tmp_path / "model.gguf"
    shutil.copyfile(fixture_paths("gemma3", "q8_0").gguf, path)
    g = GGUFFile(path)
    ref = load_reference(g)
    emb = ref.w.rows("token_embd.weight", np.array([1, 2]))  # read before: fine
    g.release_mapping()
    assert g.buffer is None  # nothing maps the file any more
    with pytest.raises(ModelFileError, match="released"):
        g.tensor_data("token_embd.weight")
    os.truncate(path, g.data_offset + 100)
    with pytest.raises(ModelFileError, match="shorter than when it was opened"):
        ref.w.rows("token_embd.weight", np.array([1, 2]))
    with pytest.raises(ModelFileError, match="shorter than when it was opened"):
        ref.w.get("output_norm.weight")
    assert emb.shape == (2, ref.config.n_embd)
    g.close()
