"""`reflex stdio` / `reflex uds`: the line protocol in process (fake engine, tests/fake_engine.py), then
the real commands as subprocesses on the embedded Gemma 3 270M with the CPU backend."""

from __future__ import annotations

import io
import json
import os
import select
import socket
import stat
import subprocess
import sys
import tempfile

import pytest

from reflex_runtime.frontends import ipc
from reflex_runtime.errors import ReflexError

from fake_engine import REPLY, make_engine


def _run_lines(engine, text: bytes):
    out = []
    more = ipc.serve_lines(engine, io.BytesIO(text).readline, out.append)
    return more, out


def _lines(*objs) -> bytes:
    return b"".join((o if isinstance(o, bytes) else json.dumps(o).encode()) + b"\n" for o in objs)


# -- the protocol, in process -------------------------------------------------------------------


def test_requests_are_answered_in_order_and_errors_do_not_stop_the_loop():
    engine = make_engine()
    more, out = _run_lines(engine, _lines(
        {"id": 1, "op": "generate", "prompt": "hi", "max_tokens": 5},
        b"{not json",
        {"id": "x", "op": "generate", "prompt": "hi", "max_tokens": 99999},
        {"id": 2, "op": "frob"},
        {"id": 3, "op": "generate", "prompt": "hi", "top_p": "high"},
        b"",  # blank lines are not requests
        b"[1, 2]",
        {"id": [1], "op": "ping"},
        {"id": 4, "op": "system1", "prompt": "q", "candidates": ["Hello", "Nope"]},
        {"id": 5, "op": "ping"},
    ))
    assert more is True  # EOF, not shutdown
    assert [o["id"] for o in out] == [1, None, "x", 2, 3, None, None, 4, 5]
    assert out[0]["text"] == "Hello" and out[0]["finish_reason"] == "length" and out[0]["record"]["generated_tokens"] == 5
    assert out[1]["error"]["message"].startswith("invalid JSON")
    assert out[2]["error"]["field"] == "max_tokens"
    assert out[3]["error"]["field"] == "op"
    assert out[4]["error"] == {"message": out[4]["error"]["message"], "type": "invalid_request_error", "field": "top_p",
                               "code": None, "status": 400}
    assert out[6]["error"]["field"] == "id"
    assert out[7]["op"] == "system1" and out[7]["best_index"] == 0
    assert out[8] == {"id": 5, "op": "ping", "ok": True, "model": "fake-model", "requests_served": 2}


def test_stream_sends_deltas_then_one_final_line():
    _, out = _run_lines(make_engine(), _lines({"id": 9, "op": "generate", "prompt": "hi", "stream": True,
                                               "max_tokens": 64}))
    deltas, final = out[:-1], out[-1]
    assert all(set(d) == {"id", "delta"} and d["id"] == 9 for d in deltas) and len(deltas) > 1
    assert "".join(d["delta"] for d in deltas) == final["text"] == REPLY
    assert final["finish_reason"] == "stop" and final["op"] == "generate"


def test_shutdown_stops_reading():
    more, out = _run_lines(make_engine(), _lines({"id": 1, "op": "shutdown"}, {"id": 2, "op": "ping"}))
    assert more is False and out == [{"id": 1, "op": "shutdown", "ok": True}]


def test_oversized_line_is_skipped(monkeypatch):
    monkeypatch.setattr(ipc, "MAX_LINE", 64)
    more, out = _run_lines(make_engine(), b'{"id": 1, "op": "ping", "pad": "' + b"x" * 500 + b'"}\n' + _lines({"id": 2, "op": "ping"}))
    assert "longer than 64" in out[0]["error"]["message"] and out[1]["id"] == 2 and len(out) == 2


def test_client_gone_mid_stream_closes_the_generation():
    engine = make_engine()
    sent = []

    def write(obj):
        if len(sent) == 2:
            raise ipc.ClientGone("broken pipe")
        sent.append(obj)

    with pytest.raises(ipc.ClientGone):
        ipc.serve_lines(engine, io.BytesIO(_lines({"id": 1, "op": "generate", "prompt": "hi", "stream": True})).readline,
                        write)
    assert engine.runner.closed == 1 and engine.runner.tokens < len(REPLY)


def test_an_engine_oserror_is_a_request_error_not_a_lost_client():
    engine = make_engine()

    def broken(*a, **k):
        raise OSError("disk went away")

    engine.system1 = broken
    _, out = _run_lines(engine, _lines({"id": 1, "op": "system1", "prompt": "q", "candidates": ["a"]},
                                       {"id": 2, "op": "ping"}))
    assert out[0]["id"] == 1 and out[0]["error"]["type"] == "internal_error" and "disk went away" in out[0]["error"]["message"]
    assert out[1]["op"] == "ping"


# -- the socket ---------------------------------------------------------------------------------


@pytest.fixture
def sock_path():
    # AF_UNIX paths are limited to ~107 bytes: pytest's tmp_path can be longer.
    d = tempfile.mkdtemp(prefix="reflex-test-", dir="/tmp")
    path = os.path.join(d, "s.sock")
    yield path
    if os.path.lexists(path):
        os.unlink(path)
    os.rmdir(d)


def test_bind_socket_mode_0600_and_live_socket_refused(sock_path):
    old = os.umask(0o000)  # even a permissive umask gives 0600
    try:
        s = ipc.bind_socket(sock_path)
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE(os.stat(sock_path).st_mode) == 0o600
        with pytest.raises(ReflexError, match="in use"):
            ipc.bind_socket(sock_path)
        assert os.path.exists(sock_path)
    finally:
        s.close()


def test_stale_socket_is_replaced_other_files_are_not(sock_path):
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(sock_path)
    dead.close()  # the file stays, nobody listens
    s = ipc.bind_socket(sock_path)
    s.close()
    os.unlink(sock_path)
    with open(sock_path, "w") as f:
        f.write("data")
    with pytest.raises(ReflexError, match="not a socket"):
        ipc.bind_socket(sock_path)
    assert open(sock_path).read() == "data"


# -- the real commands (embedded model, CPU) ----------------------------------------------------------


CLI = [sys.executable, "-m", "reflex_runtime.cli"]


def _start(args, stdin=subprocess.PIPE):
    return subprocess.Popen(CLI + args, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _read_json(f) -> dict:
    line = f.readline()
    assert line, "the process closed its output"
    return json.loads(line)


def test_stdio_end_to_end():
    p = _start(["stdio", "--backend", "cpu"])
    try:
        ready = _read_json(p.stdout)
        assert ready["op"] == "ready" and ready["backend"] == "cpu" and ready["coldstart"]["stages"]
        p.stdin.write(_lines(
            {"id": 1, "op": "generate", "prompt": "The capital of France is", "max_tokens": 4},
            b"this is not json",
            {"id": 2, "op": "generate", "prompt": "The capital of France is", "max_tokens": 4, "stream": True},
            {"id": 3, "op": "ping"},
            {"id": 4, "op": "shutdown"},
        ))
        p.stdin.flush()
        first = _read_json(p.stdout)
        assert first["id"] == 1 and first["record"]["generated_tokens"] <= 4 and first["record"]["cold_start"]
        assert _read_json(p.stdout)["error"]["type"] == "invalid_request_error"
        deltas = []
        while "delta" in (msg := _read_json(p.stdout)):
            assert msg["id"] == 2
            deltas.append(msg["delta"])
        assert msg["id"] == 2 and "".join(deltas) == msg["text"] == first["text"]  # greedy: same answer
        assert _read_json(p.stdout) == {"id": 3, "op": "ping", "ok": True, "model": ready["model"], "requests_served": 2}
        assert _read_json(p.stdout) == {"id": 4, "op": "shutdown", "ok": True}
        assert p.wait(timeout=30) == 0 and p.stdout.read() == b""
    finally:
        p.kill()
        p.wait()


def test_stdio_eof_exits_cleanly():
    p = subprocess.run(CLI + ["stdio", "--backend", "cpu"], input=b"", capture_output=True, timeout=120)
    assert p.returncode == 0
    (line,) = p.stdout.splitlines()
    assert json.loads(line)["op"] == "ready"


def test_stdio_model_load_error_is_one_line_and_nonzero(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf at all")
    p = subprocess.run(CLI + ["stdio", "--backend", "cpu", "--model", str(bad)], input=b"", capture_output=True,
                       timeout=60)
    assert p.returncode != 0
    (line,) = p.stdout.splitlines()
    err = json.loads(line)
    assert err["id"] is None and err["error"]["type"] == "model_file_error"
    assert len(p.stderr.decode().strip().splitlines()) == 1


def _connect(path) -> tuple[socket.socket, io.BufferedReader]:
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.settimeout(120)
    c.connect(path)
    return c, c.makefile("rb")


def test_uds_end_to_end(sock_path):
    p = _start(["uds", sock_path, "--backend", "cpu"], stdin=subprocess.DEVNULL)
    try:
        ready = _read_json(p.stdout)
        assert ready["op"] == "ready"
        assert stat.S_IMODE(os.stat(sock_path).st_mode) == 0o600
        a, fa = _connect(sock_path)
        assert _read_json(fa)["op"] == "ready"  # every connection starts with the ready line
        a.sendall(_lines({"id": "g", "op": "generate", "prompt": "Hello", "max_tokens": 3, "stream": True},
                         b'{"id": "m", "op": }',
                         {"id": "s", "op": "system1", "prompt": "The capital of France is",
                          "candidates": [" Paris", " London"]}))
        msgs = []
        while not msgs or "delta" in msgs[-1]:
            msgs.append(_read_json(fa))
        assert all(m["id"] == "g" for m in msgs) and msgs[-1]["record"]["generated_tokens"] <= 3
        assert _read_json(fa)["error"]["field"] is None  # the malformed line: its id cannot be read
        s1 = _read_json(fa)
        assert s1["id"] == "s" and s1["best_text"] == " Paris"

        # A second client is served while the first is connected (the scheduler batches them).
        b, fb = _connect(sock_path)
        b.sendall(_lines({"id": "b1", "op": "ping"}))
        assert _read_json(fb)["op"] == "ready" and _read_json(fb)["id"] == "b1"
        a.sendall(_lines({"id": "a2", "op": "ping"}))
        assert _read_json(fa)["id"] == "a2"  # the first one is still answered
        fa.close()
        a.close()  # (the fd closes only once its makefile is closed too)

        # A second server on a live socket refuses, and leaves the socket alone.
        q = subprocess.run(CLI + ["uds", sock_path, "--backend", "cpu"], capture_output=True, timeout=60)
        assert q.returncode != 0 and b"in use" in q.stderr and os.path.exists(sock_path)
        assert json.loads(q.stdout.splitlines()[0])["error"]["message"].endswith("is in use by a running server")

        b.sendall(_lines({"id": "bye", "op": "shutdown"}))
        assert _read_json(fb) == {"id": "bye", "op": "shutdown", "ok": True}
        assert p.wait(timeout=30) == 0
        assert not os.path.exists(sock_path)  # cleaned up on exit
        fb.close()
        b.close()
    finally:
        p.kill()
        p.wait()


def test_uds_sigterm_removes_the_socket(sock_path):
    p = _start(["uds", sock_path, "--backend", "cpu"], stdin=subprocess.DEVNULL)
    try:
        assert _read_json(p.stdout)["op"] == "ready"
        p.terminate()
        assert p.wait(timeout=30) == 0
        assert not os.path.exists(sock_path)
    finally:
        p.kill()
        p.wait()
