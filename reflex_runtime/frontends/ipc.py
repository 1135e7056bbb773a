"""`reflex stdio` and `reflex uds PATH`: JSON lines in, JSON lines out, one request at a time per
stream (uds serves its connections concurrently, batched by the engine's scheduler).

A thin transport over the request layer (reflex_runtime/api/direct_ops.py decides every answer).
Protocol (the same on both transports):
- The first line out is `{"op": "ready", ...}` with the cold-start record, once the model is loaded
  (on a socket, every connection gets it first). A load failure is one `{"id": null, "error": ...}`
  line and a non-zero exit.
- Each request line `{"id", "op": "generate" | "system1" | "ping" | "shutdown", ...}` gets exactly one
  response line, strictly in order; a `"stream": true` generate first sends `{"id", "delta"}` lines.
- A malformed line, unknown op or bad field gets `{"id", "error": {"message", "type", "field",
  "code", "status"}}` (id null when it cannot be read) and the loop goes on. Blank lines are
  skipped unanswered.
- With an API key (`--api-key` or $REFLEX_API_KEY), every line but `ping` must carry
  `"authorization": "Bearer <key>"` (the HTTP header's grammar, api/auth.py), else status 401.
- EOF ends stdio (exit 0); on a socket it ends that connection. `shutdown` ends the process.

The socket serves up to `--parallel` + `--max-queue` + 1 connections at once (one without a
scheduler), each on its own thread; a request beyond the scheduler's queue gets a "busy" error
line (status 429, `retry_after_s`). Further clients wait in the listen backlog and are accepted
once a connection ends, or once one has not completed a request line within `--idle-timeout`
seconds while another waits: a deadline per line, which bytes trickling in do not extend (the
slow one gets an error line with code "idle_timeout" and is closed).

A client that leaves is noticed before its generation and after every token (api/client_watch.py:
on the socket a close, not a shut sending side; on stdio the reader of stdout closing), and the
writes of one request's answer may block WRITE_TIMEOUT seconds in total.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import stat
import sys
import threading
import time

from ..api.client_watch import ClientLeft, StallBudget, pipe_gone, small_send_buffer, socket_gone
from ..api.direct_ops import LINE_OPS, answer
from ..api.json_wire import MAX_BODY_BYTES, dumps, parse_object
from ..api.responses import line_error
from ..errors import ReflexError, RequestError

MAX_LINE = MAX_BODY_BYTES  # longer lines are answered with an error and skipped
IDLE_TIMEOUT = 10.0  # seconds one request line may take to arrive while another client waits
WRITE_TIMEOUT = 10.0  # seconds the writes of one request's answer may block, in total

# A write to the client failed, or it left mid-request: stop answering it (an engine OSError is a
# request error, not this).
ClientGone = ClientLeft


class Idle(Exception):
    """The client sent nothing for too long while another waited."""


def main(args, timeline) -> int:
    if args.command == "uds":
        return _serve_uds(args, timeline)
    return _serve_stdio(args, timeline)


# -- the line protocol ------------------------------------------------------------------------


def _line(obj) -> bytes:
    return dumps(obj) + b"\n"


def parse_line(line: bytes) -> tuple[object, dict]:
    """(id, request) from one line; RequestError when it is not a JSON object with a usable id."""
    d = parse_object(line)
    rid = d.get("id")
    if rid is not None and (isinstance(rid, bool) or not isinstance(rid, (str, int))):
        raise RequestError("'id' must be a string, an integer or null", field="id")
    return rid, d


def ready_line(engine, timeline) -> dict:
    if timeline is not None:
        timeline.mark("ready")
    rec = timeline.record("ready") if timeline is not None else None
    return {"id": None, "op": "ready", "model": engine.model_name, "backend": engine.runner.name,
            "max_context": engine.runner.max_context,
            "process_start_to_ready_ms": rec["process_start_to_first_token_ms"] if rec else None,
            "fallback_reason": engine.fallback_reason, "coldstart": rec}


def serve_lines(engine, readline, write, api_key: str | None = None, gone=None) -> bool:
    """Answer lines until EOF (returns True) or `shutdown` (returns False). `write(dict)` raises
    ClientGone when the client cannot be written to, as a generation does when `gone()` turns
    true; that, Idle, and read errors propagate."""
    while True:
        line = readline(MAX_LINE + 1)
        if not line:
            return True
        if len(line) > MAX_LINE and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):  # skip the rest of the oversized line
                line = readline(MAX_LINE + 1)
            write(line_error(None, RequestError(f"request line longer than {MAX_LINE} bytes", status=413)))
            continue
        if not line.strip():
            continue
        rid = None
        try:
            rid, d = parse_line(line)
            replies = answer(engine, d, api_key=api_key, ops=LINE_OPS, deltas=True, gone=gone)
            try:  # a failed write closes the generation behind the replies at this token
                for obj in replies:
                    write({"id": rid, **obj})
                    if obj.get("op") == "shutdown":
                        return False
            finally:
                replies.close()
        except (ClientGone, Idle):
            raise
        except Exception as e:
            write(line_error(rid, e))


def _load(args, timeline, write):
    """The engine (uds: with its scheduler); a failure is written as an error line, then re-raised
    for the CLI's one-line message and exit code."""
    from ..engine import DEFAULT_PARALLEL, serving_limits
    from ..loader import load_engine

    try:
        engine = load_engine(args.model, args.backend, timeline, max_context=args.ctx,
                             limits=serving_limits(getattr(args, "request_timeout", None)),
                             # stdio answers one request at a time: one sequence's cache
                             max_seqs=(args.parallel or DEFAULT_PARALLEL) if args.command == "uds" else 1,
                             kv_tokens=getattr(args, "kv_tokens", None))
        if args.command == "uds":
            engine.start_scheduler(args.parallel, args.max_queue)
        return engine
    except Exception as e:
        write(line_error(None, e))
        raise


# -- stdio ------------------------------------------------------------------------------------


def _serve_stdio(args, timeline) -> int:
    # Responses go to a private copy of stdout; fd 1 and sys.stdout now point at stderr, so a
    # stray print anywhere (or a C library) cannot corrupt the protocol stream.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def write(obj: dict) -> None:
        try:
            out.write(_line(obj))
            out.flush()  # one line, whole, per write (a raw write may be partial)
        except OSError as e:
            raise ClientGone(str(e)) from None

    try:
        engine = _load(args, timeline, write)
        write(ready_line(engine, timeline))
        serve_lines(engine, sys.stdin.buffer.readline, write, getattr(args, "api_key", None),
                    gone=lambda: pipe_gone(out.fileno()))
    except ClientGone:
        return 0  # the reader went away: nothing left to answer
    finally:
        try:
            out.close()
        except OSError:
            pass
    return 0


# -- unix socket ------------------------------------------------------------------------------


def bind_socket(path: str) -> socket.socket:
    """Listen on `path` with mode 0600. A stale socket file (nobody accepting) is replaced; a
    live one, or any other kind of file, is an error."""
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise ReflexError(f"{path} exists and is not a socket; not replacing it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(2.0)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            os.unlink(path)  # stale: its server is gone
        except OSError as e:
            raise ReflexError(f"cannot tell whether {path} is in use: {e}") from None
        else:
            raise ReflexError(f"{path} is in use by a running server")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # bind() creates the file with the process umask; no other thread of ours runs yet.
    old = os.umask(0o177)
    try:
        sock.bind(path)
    except OSError as e:
        sock.close()
        raise ReflexError(f"cannot bind {path}: {e.strerror or e}") from None
    finally:
        os.umask(old)
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode != 0o600:
        sock.close()
        os.unlink(path)
        raise ReflexError(f"{path} was created with mode {mode:o}, not 600")
    sock.listen(16)
    return sock


def _serve_uds(args, timeline) -> int:
    path = args.path

    def stdout_write(obj: dict) -> None:
        sys.stdout.buffer.write(_line(obj))
        sys.stdout.buffer.flush()

    try:
        sock = bind_socket(path)  # before loading: early clients wait in the backlog
    except ReflexError as e:
        stdout_write(line_error(None, e))
        raise
    ino = os.stat(path).st_ino
    # SIGTERM (the usual stop) must still remove the socket file.
    prev = signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        engine = _load(args, timeline, stdout_write)
        ready = ready_line(engine, timeline)
        stdout_write(ready)
        serve_socket(engine, sock, ready, getattr(args, "api_key", None), getattr(args, "idle_timeout", IDLE_TIMEOUT))
        return 0
    finally:
        signal.signal(signal.SIGTERM, prev)
        sock.close()
        try:
            if os.stat(path).st_ino == ino:  # only our own file, never a successor's
                os.unlink(path)
        except OSError:
            pass


def connection_slots(engine) -> int:
    """Connections served at once: every request the scheduler may hold, and one more, which gets
    the "busy" line when the queue is full; one without a scheduler."""
    sched = getattr(engine, "scheduler", None)
    return 1 if sched is None else sched.max_seqs + sched.max_queue + 1


def serve_socket(engine, sock: socket.socket, ready: dict, api_key: str | None = None,
                 idle_timeout: float = IDLE_TIMEOUT) -> None:
    """Accept and serve connections, each on its own thread (connection_slots at once), until a
    client asks for shutdown."""
    slots = threading.BoundedSemaphore(connection_slots(engine))
    stop = threading.Event()
    poll = select.poll()
    poll.register(sock, select.POLLIN)

    def serve(conn):
        try:
            if not _serve_connection(engine, conn, sock, ready, api_key, idle_timeout):
                stop.set()
        finally:
            slots.release()

    while not stop.is_set():
        if not slots.acquire(timeout=0.25):
            continue
        if not poll.poll(250):
            slots.release()
            continue
        conn, _ = sock.accept()
        threading.Thread(target=serve, args=(conn,), name="reflex-uds-conn", daemon=True).start()


class _LineReader:
    """readline(limit) over a connection, watching the listening socket. While a connection waits
    in the backlog, the line being read must be whole within `idle_timeout` of the later of the
    read's start and the moment a waiter was seen; bytes that trickle in do not extend it (Idle
    is raised). A client alone on the socket may take as long as it likes."""

    def __init__(self, conn: socket.socket, listener: socket.socket, idle_timeout: float):
        self.conn, self.listener, self.idle_timeout = conn, listener, idle_timeout
        self.buf = b""
        self.eof = False

    def readline(self, limit: int) -> bytes:
        waiting_since = None
        poll = select.poll()
        poll.register(self.conn, select.POLLIN)
        poll.register(self.listener, select.POLLIN)
        while True:
            nl = self.buf.find(b"\n", 0, limit)
            if nl >= 0 or len(self.buf) >= limit or self.eof:
                n = nl + 1 if nl >= 0 else min(limit, len(self.buf))
                line, self.buf = self.buf[:n], self.buf[n:]
                return line
            ready = {fd for fd, _ in poll.poll(250)}
            if self.conn.fileno() in ready:
                data = self.conn.recv(1 << 16)
                if not data:
                    self.eof = True
                self.buf += data
            if self.listener.fileno() in ready:
                now = time.monotonic()
                waiting_since = waiting_since or now
                if now - waiting_since >= self.idle_timeout:
                    raise Idle()
                if self.conn.fileno() not in ready:
                    time.sleep(0.05)  # the listener stays readable until accepted: do not spin
            else:
                waiting_since = None  # the waiter gave up


def _serve_connection(engine, conn: socket.socket, listener: socket.socket, ready: dict,
                      api_key: str | None, idle_timeout: float) -> bool:
    """Serve one client to EOF; False when it asked for shutdown."""
    small_send_buffer(conn)  # a client that stops reading blocks our writes early: the budget then runs
    reader = _LineReader(conn, listener, idle_timeout)
    budget = [StallBudget(conn, WRITE_TIMEOUT)]  # a new one per request line; recv only follows poll()

    def readline(limit: int) -> bytes:
        line = reader.readline(limit)
        budget[0] = StallBudget(conn, WRITE_TIMEOUT)
        return line

    def write(obj: dict) -> None:
        try:
            budget[0].write(conn.sendall, _line(obj))
        except OSError as e:
            raise ClientGone(str(e)) from None

    with conn:
        try:
            write(ready)
            return serve_lines(engine, readline, write, api_key, gone=lambda: socket_gone(conn, half_close=False))
        except Idle:
            budget[0] = StallBudget(conn, WRITE_TIMEOUT)
            try:
                write(line_error(None, RequestError(
                    f"closed: no whole request line within {idle_timeout:g} s while another client waited",
                    status=408, code="idle_timeout")))
            except ClientGone:
                pass
            return True
        except (ClientGone, OSError):  # the client went away (mid-stream or not): serve the next one
            return True
