"""`reflex stdio` and `reflex uds PATH`: JSON lines in, JSON lines out, one request at a time.

Protocol (the same on both transports):
- The first line out is `{"op": "ready", ...}` with the cold-start record, once the model is loaded
  (on a socket, every connection gets it first). A load failure is one `{"id": null, "error": ...}`
  line and a non-zero exit.
- Each request line `{"id", "op": "generate" | "system1" | "ping" | "shutdown", ...}` gets exactly one
  response line, strictly in order; a `"stream": true` generate first sends `{"id", "delta"}` lines.
- A malformed line, unknown op or bad field gets `{"id", "error": {"message", "type", "field"}}`
  (id null when it cannot be read) and the loop goes on. Blank lines are skipped unanswered.
- EOF ends stdio (exit 0); on a socket it ends that connection. `shutdown` ends the process.

The socket serves one connection at a time, to completion, in accept order: a second client's
connect succeeds (the listen backlog) but it is read only after the first disconnects.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import sys

from .errors import ReflexError, RequestError

MAX_LINE = 4 * 1024 * 1024  # bytes; longer lines are answered with an error and skipped


class ClientGone(Exception):
    """A write to the client failed: stop answering it (an engine OSError is a request error)."""


def main(args, timeline) -> int:
    if args.command == "uds":
        return _serve_uds(args, timeline)
    return _serve_stdio(args, timeline)


# -- the line protocol ------------------------------------------------------------------------


def _dumps(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"


def error_line(rid, err: BaseException) -> dict:
    if isinstance(err, ReflexError):
        e = {"message": str(err), "type": err.kind, "field": getattr(err, "field", None)}
    else:  # a bug: report it, keep serving
        e = {"message": "internal error: " + " ".join(f"{type(err).__name__}: {err}".split()),
             "type": "internal_error", "field": None}
    return {"id": rid, "error": e}


def _no_constants(name):
    raise RequestError(f"invalid JSON: {name} is not allowed")


def parse_line(line: bytes) -> tuple[object, dict]:
    """(id, request) from one line; RequestError when it is not a JSON object with a usable id."""
    try:
        d = json.loads(line.decode("utf-8"), parse_constant=_no_constants)
    except UnicodeDecodeError:
        raise RequestError("invalid JSON: not UTF-8") from None
    except json.JSONDecodeError as e:
        raise RequestError(f"invalid JSON: {e.msg} at column {e.colno}") from None
    if not isinstance(d, dict):
        raise RequestError("a request must be a JSON object")
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
            "fallback_reason": getattr(engine, "fallback_reason", None), "coldstart": rec}


def handle(engine, rid, d: dict, write) -> bool:
    """Answer one request through write(dict); False after `shutdown`. Errors propagate."""
    from .engine import Finished
    from .ops import check_bool, parse_generate, parse_system1

    op = d.get("op")
    if op == "generate":
        stream = check_bool(d, "stream", False)
        req = parse_generate(d)
        gen = engine.generate(req)
        try:  # a write that fails (client gone) closes the generation at this token
            for ev in gen:
                if isinstance(ev, Finished):
                    write({"id": rid, "op": "generate", "text": ev.text, "finish_reason": ev.finish_reason,
                           "record": ev.record})
                elif stream:
                    write({"id": rid, "delta": ev.text})
        finally:
            gen.close()
    elif op == "system1":
        prompt, candidates, messages, chat = parse_system1(d)
        write({"id": rid, "op": "system1", **engine.system1(prompt, candidates, messages, chat)})
    elif op == "ping":
        write({"id": rid, "op": "ping", "ok": True, "model": engine.model_name,
               "requests_served": engine.requests_served})
    elif op == "shutdown":
        write({"id": rid, "op": "shutdown", "ok": True})
        return False
    else:
        raise RequestError(f"unknown op {json.dumps(op)[:64]} (use generate, system1, ping or shutdown)", field="op")
    return True


def serve_lines(engine, readline, write) -> bool:
    """Answer lines until EOF (returns True) or `shutdown` (returns False). `write` raises
    ClientGone when the client cannot be written to; that, and read errors, propagate."""
    while True:
        line = readline(MAX_LINE + 1)
        if not line:
            return True
        if len(line) > MAX_LINE and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):  # skip the rest of the oversized line
                line = readline(MAX_LINE + 1)
            write(error_line(None, RequestError(f"request line longer than {MAX_LINE} bytes")))
            continue
        if not line.strip():
            continue
        rid = None
        try:
            rid, d = parse_line(line)
            if not handle(engine, rid, d, write):
                return False
        except ClientGone:
            raise
        except Exception as e:
            write(error_line(rid, e))


def _load(args, timeline, write):
    """The engine; a failure is written as an error line, then re-raised for the CLI's one-line
    message and exit code."""
    from .loader import load_engine

    try:
        return load_engine(args.model, args.backend, timeline, max_context=args.ctx)
    except Exception as e:
        write(error_line(None, e))
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
            out.write(_dumps(obj))
            out.flush()  # one line, whole, per write (a raw write may be partial)
        except OSError as e:
            raise ClientGone(str(e)) from None

    try:
        engine = _load(args, timeline, write)
        write(ready_line(engine, timeline))
        serve_lines(engine, sys.stdin.buffer.readline, write)
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
        sys.stdout.buffer.write(_dumps(obj))
        sys.stdout.buffer.flush()

    try:
        sock = bind_socket(path)  # before loading: early clients wait in the backlog
    except ReflexError as e:
        stdout_write(error_line(None, e))
        raise
    ino = os.stat(path).st_ino
    # SIGTERM (the usual stop) must still remove the socket file.
    prev = signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        engine = _load(args, timeline, stdout_write)
        ready = ready_line(engine, timeline)
        stdout_write(ready)
        while True:
            conn, _ = sock.accept()
            if not _serve_connection(engine, conn, ready):
                return 0
    finally:
        signal.signal(signal.SIGTERM, prev)
        sock.close()
        try:
            if os.stat(path).st_ino == ino:  # only our own file, never a successor's
                os.unlink(path)
        except OSError:
            pass


def _serve_connection(engine, conn: socket.socket, ready: dict) -> bool:
    """Serve one client to EOF; False when it asked for shutdown."""
    with conn, conn.makefile("rb") as rfile:
        def write(obj: dict) -> None:
            try:
                conn.sendall(_dumps(obj))
            except OSError as e:
                raise ClientGone(str(e)) from None

        try:
            write(ready)
            return serve_lines(engine, rfile.readline, write)
        except (ClientGone, OSError):  # the client went away (mid-stream or not): serve the next one
            return True
