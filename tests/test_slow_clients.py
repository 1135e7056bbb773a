"""Slow and silent clients cannot hold the engine (issue 30, item 4), on each front end with a
connection: `serve` (HTTP), `uds`, `stdio` (the Lambda handler has none).

- A uds client that sends a byte now and then, never a newline: each line has a deadline while
  another client waits (it used to restart with every byte: the other client's ping waited 50 s).
- A streaming client that never reads: the writes of one answer share one stall budget and the
  stream's send buffer is small (it used to hold the engine for the whole request timeout).
- A client that hangs up during a non-streaming generation: noticed at the next token (it used
  to run to its end).
Each test asserts the engine is free again (another client answered) well before what the fix
replaced would allow. These drive the front ends, not the engine, so they keep applying once a
shared scheduler runs requests batched (issue 32).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from reflex_runtime.frontends import ipc, serve
from reflex_runtime.api.client_watch import pipe_gone

from fake_engine import make_engine
from front_ends import KEY, ServeFront

AUTH = "Bearer " + KEY
LONG = "y" * 6000  # a reply of 6,000 tokens (one per byte)


def long_engine(delay: float = 0.0):
    return make_engine(reply=LONG, delay=delay, max_context=8192, max_new_tokens=7000)


@pytest.fixture
def quiet(monkeypatch):
    monkeypatch.setattr(serve, "_log", lambda msg: None)


# -- uds ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def uds_server(engine, idle_timeout: float):
    d = tempfile.mkdtemp(prefix="reflex-test-", dir="/tmp")
    path = os.path.join(d, "s.sock")
    sock = ipc.bind_socket(path)
    t = threading.Thread(target=ipc.serve_socket, args=(engine, sock, {"id": None, "op": "ready"}, None,
                                                         idle_timeout), daemon=True)
    t.start()
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            bye = uds_client(path, 5)
            bye.sendall(b'{"op": "shutdown"}\n')
            t.join(10)
        sock.close()
        os.unlink(path)
        os.rmdir(d)


def uds_client(path: str, timeout: float = 10, rcvbuf: int | None = None) -> socket.socket:
    c = socket.socket(socket.AF_UNIX)
    if rcvbuf:
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    c.settimeout(timeout)
    c.connect(path)
    return c


def read_line(c: socket.socket) -> dict:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = c.recv(1)
        if not chunk:
            raise EOFError("closed")
        buf += chunk
    return json.loads(buf)


def ping_time(path: str, timeout: float = 20) -> float:
    """Seconds until a new client's ping is answered (it waits in the backlog for its turn)."""
    c = uds_client(path, timeout)
    t0 = time.monotonic()
    try:
        c.sendall(b'{"id": "p", "op": "ping"}\n')
        assert read_line(c)["op"] == "ready"
        assert read_line(c)["id"] == "p"
        return time.monotonic() - t0
    finally:
        c.close()


def test_uds_a_byte_trickle_does_not_extend_the_line_deadline():
    with uds_server(make_engine(), idle_timeout=1.0) as path:
        slow = uds_client(path)
        assert read_line(slow)["op"] == "ready"
        stop = threading.Event()

        def trickle():  # one byte every 0.2 s, never a newline (the report: one every 3 s vs a 10 s timer)
            for b in b'{"id": 1, "op": "ping"' * 50:
                if stop.wait(0.2):
                    return
                with contextlib.suppress(OSError):
                    slow.sendall(bytes([b]))

        threading.Thread(target=trickle, daemon=True).start()
        time.sleep(0.5)
        try:
            waited = ping_time(path)
            assert waited < 1.0 + 1.5, waited  # the deadline (1 s) plus polling slack; unbounded before
            kicked = read_line(slow)
            assert kicked["error"]["code"] == "idle_timeout" and kicked["error"]["status"] == 408
            assert "no whole request line within 1 s" in kicked["error"]["message"]
        finally:
            stop.set()
            slow.close()


def test_uds_a_line_that_keeps_coming_in_time_is_still_served():
    """The deadline is per line: a client that completes each line in time keeps its turn."""
    with uds_server(make_engine(), idle_timeout=1.0) as path:
        c = uds_client(path)
        assert read_line(c)["op"] == "ready"
        other = uds_client(path)  # waits in the backlog the whole time
        for j in range(3):
            for part in (b'{"id": %d, ' % j, b'"op": "ping"}\n'):
                c.sendall(part)
                time.sleep(0.3)
            assert read_line(c)["id"] == j
        c.close()
        assert read_line(other)["op"] == "ready"
        other.close()


def test_uds_a_streaming_client_that_never_reads_is_dropped(monkeypatch):
    monkeypatch.setattr(ipc, "WRITE_TIMEOUT", 1.0)
    engine = long_engine()
    with uds_server(engine, idle_timeout=60) as path:
        deaf = uds_client(path)
        deaf.sendall(json.dumps({"id": 1, "op": "generate", "prompt": "x", "max_tokens": 6000, "stream": True})
                     .encode() + b"\n")  # and never reads, not even the ready line
        time.sleep(0.2)
        waited = ping_time(path)
        assert waited < 1.0 + 3.0, waited
        assert engine.runner.closed == 1 and engine.runner.tokens < len(LONG), engine.runner.tokens
        deaf.close()


def test_uds_a_client_reading_a_little_now_and_then_cannot_hold_the_stream(monkeypatch):
    """Each small read lets the blocked write go on well within a per-write timeout, which used
    to restart every time; the budget adds the blocked time up (1 s here)."""
    monkeypatch.setattr(ipc, "WRITE_TIMEOUT", 1.0)
    engine = long_engine(delay=0.003)  # 18 s of engine time
    stop = threading.Event()
    with uds_server(engine, idle_timeout=60) as path:
        sipper = uds_client(path)
        sipper.sendall(json.dumps({"id": 1, "op": "generate", "prompt": "x", "max_tokens": 6000, "stream": True})
                       .encode() + b"\n")

        def sip():
            while not stop.wait(0.3):
                with contextlib.suppress(OSError):
                    sipper.recv(512)

        threading.Thread(target=sip, daemon=True).start()
        time.sleep(0.2)
        try:
            waited = ping_time(path, timeout=40)
            assert waited < 6, waited
            assert engine.runner.tokens < 3000, engine.runner.tokens
        finally:
            stop.set()
            sipper.close()


def test_uds_a_client_that_hangs_up_frees_the_engine_at_the_next_token():
    engine = long_engine(delay=0.01)  # 60 s for the whole reply
    with uds_server(engine, idle_timeout=60) as path:
        c = uds_client(path)
        assert read_line(c)["op"] == "ready"
        c.sendall(json.dumps({"id": 1, "op": "generate", "prompt": "x", "max_tokens": 6000}).encode() + b"\n")
        time.sleep(0.3)
        c.close()
        waited = ping_time(path)
        assert waited < 1.5, waited
        assert engine.runner.tokens < 300, engine.runner.tokens


def test_uds_a_client_that_only_shuts_its_sending_side_still_gets_its_answer():
    engine = make_engine(reply="abc" * 20, delay=0.005)
    with uds_server(engine, idle_timeout=60) as path:
        c = uds_client(path)
        c.sendall(json.dumps({"id": 1, "op": "generate", "prompt": "x", "max_tokens": 100}).encode() + b"\n")
        c.shutdown(socket.SHUT_WR)  # as `nc -N` does after its last line
        assert read_line(c)["op"] == "ready"
        done = read_line(c)
        assert done["id"] == 1 and done["text"] == "abc" * 20 and done["finish_reason"] == "stop"
        c.close()


# -- serve ------------------------------------------------------------------------------------


def post(port: int, body: dict, timeout: float = 20) -> tuple[int, float]:
    t0 = time.monotonic()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", "/v1/completions", json.dumps(body), {"Authorization": AUTH})
    r = c.getresponse()
    r.read()
    c.close()
    return r.status, time.monotonic() - t0


def raw_post(port: int, body: dict, rcvbuf: int | None = None) -> socket.socket:
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect(("127.0.0.1", port))
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: %s\r\nContent-Length: %d\r\n\r\n%s"
              % (AUTH.encode(), len(data), data))
    return s


def test_serve_a_streaming_client_that_never_reads_is_dropped(quiet, monkeypatch):
    """6,000 tokens at 5 ms (30 s of engine time) to a client that reads nothing: the writes go
    into the kernel's buffers until they are full (~64 KB ours with the small send buffer, a few
    KB the client's), then block, and the budget (1 s here) ends the stream. Before, the send
    buffer grew to megabytes and the generation ran to its end (the request timeout, in the report)."""
    monkeypatch.setattr(serve, "WRITE_TIMEOUT", 1.0)
    engine = long_engine(delay=0.005)
    front = ServeFront(engine)
    try:
        deaf = raw_post(front.port, {"prompt": "x", "max_tokens": 6000, "stream": True}, rcvbuf=4096)
        time.sleep(0.2)
        status, waited = post(front.port, {"prompt": "x", "max_tokens": 2}, timeout=40)
        assert status == 200 and waited < 10, waited
        assert engine.runner.tokens < 3000, engine.runner.tokens  # the stream was cut short
        deaf.close()
    finally:
        front.close()


def test_serve_a_client_reading_a_little_now_and_then_cannot_hold_the_stream(quiet, monkeypatch):
    """A per-write timeout restarts whenever the client takes a few KB; the budget does not."""
    monkeypatch.setattr(serve, "WRITE_TIMEOUT", 2.0)
    engine = long_engine(delay=0.003)  # 18 s of engine time, ~50 KB/s of chunks; the client takes ~13 KB/s
    front = ServeFront(engine)
    stop = threading.Event()
    try:
        sipper = raw_post(front.port, {"prompt": "x", "max_tokens": 6000, "stream": True}, rcvbuf=4096)
        taken = [0]

        def sip():  # each read frees the window for the waiting write well within 2 s
            while not stop.wait(0.3):
                with contextlib.suppress(OSError):
                    taken[0] += len(sipper.recv(4096))

        threading.Thread(target=sip, daemon=True).start()
        time.sleep(0.2)
        status, waited = post(front.port, {"prompt": "x", "max_tokens": 2}, timeout=40)
        assert status == 200 and waited < 8, waited
        assert taken[0] < 400_000, taken[0]  # well short of the whole stream (~900 KB)
    finally:
        stop.set()
        front.close()


def test_serve_a_client_that_hangs_up_frees_the_engine_at_the_next_token(quiet):
    engine = long_engine(delay=0.01)  # 60 s for the whole reply
    front = ServeFront(engine)
    try:
        gone = raw_post(front.port, {"prompt": "x", "max_tokens": 6000})  # not streamed
        time.sleep(0.3)
        gone.close()
        status, waited = post(front.port, {"prompt": "x", "max_tokens": 2})
        assert status == 200 and waited < 1.5, waited
        assert engine.runner.tokens < 300, engine.runner.tokens
    finally:
        front.close()


def test_serve_a_request_whose_client_left_while_queued_never_starts(quiet):
    engine = long_engine(delay=0.01)
    front = ServeFront(engine)
    try:
        first = raw_post(front.port, {"prompt": "x", "max_tokens": 100})  # ~1 s of engine time
        time.sleep(0.1)
        queued = raw_post(front.port, {"prompt": "x", "max_tokens": 6000})
        time.sleep(0.1)
        queued.close()  # leaves while the first one runs
        first.settimeout(10)
        assert b" 200 " in first.recv(4096)
        status, waited = post(front.port, {"prompt": "x", "max_tokens": 2})
        assert status == 200 and waited < 1.5, waited
        assert engine.runner.started == 2  # the first and the last: the queued one never ran
        first.close()
    finally:
        front.close()


# -- stdio --------------------------------------------------------------------------------------


def test_stdio_a_reader_that_closes_stdout_frees_the_engine_at_the_next_token():
    """The line loop as `reflex stdio` runs it: answers go to a pipe, whose reader closes it."""
    engine = long_engine(delay=0.01)
    rfd, wfd = os.pipe()
    out = os.fdopen(wfd, "wb")
    line = json.dumps({"id": 1, "op": "generate", "prompt": "x", "max_tokens": 6000}).encode() + b"\n"
    lines = iter([line])

    def write(obj):
        try:
            out.write(json.dumps(obj).encode() + b"\n")
            out.flush()
        except OSError as e:
            raise ipc.ClientGone(str(e)) from None

    result = {}

    def run():
        try:
            result["ended"] = ipc.serve_lines(engine, lambda n: next(lines, b""), write, None,
                                              gone=lambda: pipe_gone(out.fileno()))
        except ipc.ClientGone as e:
            result["gone"] = str(e)

    t = threading.Thread(target=run, daemon=True)
    t0 = time.monotonic()
    t.start()
    time.sleep(0.3)
    os.close(rfd)  # the reader leaves mid-generation
    t.join(5)
    assert not t.is_alive() and "left during its generation" in result.get("gone", ""), result
    assert time.monotonic() - t0 < 1.5 and engine.runner.tokens < 300, engine.runner.tokens
    out.close()


@pytest.mark.slow
def test_reflex_stdio_exits_soon_after_its_reader_leaves(smollm2_path):
    """The real process: a long generation, then the reader of its stdout goes away."""
    p = subprocess.Popen([sys.executable, "-m", "reflex_runtime.cli", "stdio", "--backend", "cpu", "-m", smollm2_path],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert json.loads(p.stdout.readline())["op"] == "ready"
        p.stdin.write(b'{"id": 0, "op": "generate", "prompt": "Hi", "max_tokens": 1}\n')  # the first request
        p.stdin.flush()  # reads and dequantizes the weights (seconds): the next token is not that far
        assert json.loads(p.stdout.readline())["id"] == 0
        p.stdin.write(json.dumps({"id": 1, "op": "generate", "prompt": "Count to a thousand:", "max_tokens": 2000,
                                  "ignore_eos": True}).encode() + b"\n")
        p.stdin.flush()
        time.sleep(1.0)
        p.stdout.close()  # ~2,000 tokens at ~8 tokens/s would take minutes
        t0 = time.monotonic()
        rc = p.wait(30)
        assert rc == 0 and time.monotonic() - t0 < 5, (rc, time.monotonic() - t0)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
