"""`reflex serve`: the OpenAI-compatible HTTP server (stdlib http.server, no new dependency).

The socket listens before the model loads, so a cold container accepts its first request at
once: /healthz answers 204 while loading, 200 when ready, 503 (with the reason) if loading
failed; other requests wait for the load and are then served.

All engine work runs on ONE worker thread, the one that loaded the model: a GPU context may be
current on that thread only, and it serializes requests (a FIFO queue; concurrent clients wait
their turn). Connection threads parse, authenticate and queue a Job; the worker runs it and
writes the answer to that client itself, then the connection thread reads the next request.
A streaming client that disconnects is noticed before the next chunk is written; the worker
closes the generation there (the engine is free at the next token). A non-streaming request
runs to its end even if its client has left.
"""

from __future__ import annotations

import hmac
import json
import queue
import select
import socket
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from . import openai_api
from .errors import ReflexError

MAX_BODY = 4 * 1024 * 1024  # bytes
_POLLRDHUP = getattr(select, "POLLRDHUP", 0)  # Linux: the peer shut down its side
WRITE_TIMEOUT = 30.0  # seconds one write to a client may block the engine
ROUTES = {
    "/healthz": ("GET",),
    "/v1/models": ("GET",),
    "/v1/chat/completions": ("POST",),
    "/v1/completions": ("POST",),
    "/v1/system1": ("POST",),
}
_ENDPOINTS = {
    "/v1/chat/completions": openai_api.chat_completions,
    "/v1/completions": openai_api.completions,
    "/v1/system1": openai_api.system1,
}


def _log(msg: str) -> None:
    print(f"reflex serve: {msg}", file=sys.stderr, flush=True)


class State:
    """The model as the connection threads see it: loading, ready, or failed."""

    def __init__(self, api_key: str | None):
        self.api_key = api_key.encode() if api_key else None
        self.engine = None
        self.error: BaseException | None = None
        self.ready = threading.Event()  # set when loaded or failed
        self.jobs: queue.Queue = queue.Queue()


class Job:
    """One request for the worker, which also writes the answer: no per-token hand-off between
    threads (each costs a wake-up and a GIL switch). The connection thread waits on `done`."""

    def __init__(self, fn, body: dict, handler: "Handler"):
        self.fn, self.body, self.handler = fn, body, handler
        self.done = threading.Event()

    def run(self, engine) -> None:
        h = self.handler
        try:
            try:
                resp = self.fn(engine, self.body)
            except Exception as e:
                resp = openai_api.error_response(e)
            h.connection.settimeout(WRITE_TIMEOUT)  # a client that stops reading cannot hold the engine
            if resp.stream is None:
                h._send(resp.status, resp.body, resp.headers)
            else:
                h._write_stream(resp.stream)
        except OSError:  # the client is gone; its generation is closed already
            h.close_connection = True
        except Exception as e:  # a bug after the answer began: this connection cannot continue
            h.close_connection = True
            _log(f"internal error: {type(e).__name__}: {' '.join(str(e).split())}")
        finally:
            try:
                h.connection.settimeout(h.timeout)
            except OSError:
                pass
            self.done.set()


def _load(args, timeline):
    from .loader import load_engine

    return load_engine(args.model, args.backend, timeline, max_context=args.ctx, log=_log)


def _worker(args, timeline, state: State, load) -> None:
    try:
        engine = load(args, timeline)
    except Exception as e:  # answered as 503 with the reason from now on
        state.error = e
        state.ready.set()
        _log(f"model load failed: {' '.join(str(e).split())}")
        return
    if timeline is not None:
        _log(f"model ready: {engine.model_name} on {engine.runner.name}, "
             f"process_start_to_ready_ms={round(timeline.mark('ready') * 1000, 3)}")
    state.engine = engine
    state.ready.set()
    while True:
        job = state.jobs.get()
        if job is None:  # stop(): the server is closing
            return
        try:
            job.run(engine)
        except BaseException as e:  # a bug: keep the worker alive for the next request
            _log(f"internal error: {type(e).__name__}: {' '.join(str(e).split())}")
            job.done.set()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "reflex"
    sys_version = ""
    disable_nagle_algorithm = True  # small JSON writes must leave at once
    timeout = 300  # idle keep-alive connections and stalled readers give their thread back

    state: State  # set on the subclass main() builds

    # -- plumbing ---------------------------------------------------------------------------

    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        _log(format % args)

    def _send(self, status: int, body: dict | None, headers: dict | None = None) -> None:
        data = b"" if body is None or status == 204 else json.dumps(body, ensure_ascii=False).encode("utf-8")
        hdrs = {"Content-Type": "application/json"} if data else {}
        hdrs.update(headers or {})
        if status != 204:
            hdrs["Content-Length"] = str(len(data))
        if getattr(self, "_unread_body", False):
            hdrs["Connection"] = "close"  # the body we did not read would be parsed as a request
        if hdrs.get("Connection") == "close":
            self.close_connection = True
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = ""
        head = f"HTTP/1.1 {status} {reason}\r\nServer: reflex\r\nDate: {self.date_time_string()}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n"
        self.wfile.write(head.encode("latin-1") + (b"" if self.command == "HEAD" else data))
        self._status = status

    def _error(self, status: int, message: str, param: str | None = None, code: str | None = None,
               headers: dict | None = None, type_: str = "invalid_request_error") -> None:
        r = openai_api.api_error(status, message, type_, param, code, headers)
        self._send(r.status, r.body, r.headers)

    def send_error(self, code, message=None, explain=None):
        """The base class calls this for unparseable requests and unknown methods: answer JSON."""
        self.close_connection = True
        if not hasattr(self, "command") or self.command is None:
            self.command = ""
        self._error(code, message or HTTPStatus(code).phrase, headers={"Connection": "close"})

    def _peer_gone(self) -> bool:
        """True when the client closed its end (poll: no fd-number limit, unlike select)."""
        sock = self.connection
        try:
            p = select.poll()
            p.register(sock, select.POLLIN | _POLLRDHUP)
            ev = p.poll(0)
            if not ev:
                return False
            if ev[0][1] & (select.POLLHUP | select.POLLERR | _POLLRDHUP):
                return True
            return sock.recv(1, socket.MSG_PEEK) == b""  # readable: EOF, or a pipelined request
        except OSError:
            return True

    # -- routing ----------------------------------------------------------------------------

    def do_GET(self):
        self._route()

    def do_POST(self):
        self._route()

    def do_HEAD(self):
        self._route()

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_POST

    def _route(self) -> None:
        t0 = time.perf_counter()
        self._status = 0
        self._unread_body = self.headers.get("Content-Length", "0") not in ("", "0") or \
            "Transfer-Encoding" in self.headers
        path = urlsplit(self.path).path
        allowed = ROUTES.get(path)
        method = "GET" if self.command == "HEAD" else self.command
        try:
            if allowed is None:
                self._error(404, f"no route for {self.command} {path[:200]}", code="not_found")
            elif method not in allowed:
                self._error(405, f"{self.command} is not allowed on {path}", code="method_not_allowed",
                            headers={"Allow": ", ".join(allowed + (("HEAD",) if "GET" in allowed else ()))})
            elif path == "/healthz":  # open without a key: load balancers probe it
                self._healthz()
            elif not self._authorized():
                self._error(401, "missing or invalid API key (send 'Authorization: Bearer <key>')",
                            code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
            elif method == "GET":
                self._models()
            else:
                self._post(path)
        except OSError:  # the client hung up or stalled past the timeout
            self.close_connection = True
        finally:
            _log(f'"{self.command} {path[:200]}" {self._status} {(time.perf_counter() - t0) * 1000:.1f}ms')

    def _authorized(self) -> bool:
        key = self.state.api_key
        if key is None:
            return True
        got = self.headers.get("Authorization", "")
        return got[:7].lower() == "bearer " and hmac.compare_digest(got[7:].strip().encode(), key)

    def _wait_model(self) -> bool:
        """Block until the model is loaded; False (after answering 503) if loading failed."""
        st = self.state
        st.ready.wait()
        if st.error is not None:
            self._load_failed()
            return False
        return True

    def _load_failed(self) -> None:
        r = openai_api.error_response(self.state.error)
        self._send(503, r.body, {"Retry-After": "60"})

    # -- endpoints --------------------------------------------------------------------------

    def _healthz(self) -> None:
        st = self.state
        if not st.ready.is_set():
            self._send(204, None)
        elif st.error is not None:
            self._load_failed()
        else:
            e = st.engine
            self._send(200, {"status": "ok", "model": e.model_name, "backend": e.runner.name,
                             "requests_served": e.requests_served})

    def _models(self) -> None:
        if self._wait_model():
            r = openai_api.models(self.state.engine)
            self._send(r.status, r.body)

    def _read_body(self) -> bytes | None:
        """The request body, or None after answering 411/413/400."""
        if "Transfer-Encoding" in self.headers:
            self._error(411, "chunked request bodies are not supported: send Content-Length",
                        headers={"Connection": "close"})
            return None
        raw = self.headers.get("Content-Length")
        if raw is None:  # where the body ends is unknown: this connection cannot continue
            self._error(411, "Content-Length is required", headers={"Connection": "close"})
            return None
        if not raw.strip().isdigit():
            self._error(400, "invalid Content-Length", headers={"Connection": "close"})
            return None
        n = int(raw)
        if n > MAX_BODY:
            self._error(413, f"request body of {n} bytes exceeds the limit of {MAX_BODY}")
            self._drain(n)
            return None
        data = self.rfile.read(n)
        self._unread_body = False
        if len(data) < n:
            self.close_connection = True
            return None
        return data

    def _drain(self, n: int) -> None:
        """Read and drop a refused body (briefly, up to a cap): closing a socket with unread data
        sends a reset, and the client would see that instead of our answer."""
        self.connection.settimeout(2.0)
        left = min(n, 16 * MAX_BODY)
        try:
            while left > 0:
                chunk = self.rfile.read(min(1 << 16, left))
                if not chunk:
                    break
                left -= len(chunk)
        except OSError:
            pass

    def _post(self, path: str) -> None:
        raw = self._read_body()
        if raw is None:
            return
        try:
            body = openai_api.parse_json_body(raw)
        except ReflexError as e:
            r = openai_api.error_response(e)
            self._send(r.status, r.body)
            return
        if not self._wait_model():
            return
        job = Job(_ENDPOINTS[path], body, self)
        self.state.jobs.put(job)
        job.done.wait()

    def _write_stream(self, stream) -> None:
        """Chunked SSE, one HTTP chunk per event, written by the worker as tokens come. A client
        that left is noticed before the next chunk; closing the lines closes the generation."""
        lines = openai_api.sse_lines(stream)
        chunked = self.request_version != "HTTP/1.0"  # 1.0 clients get a body that ends at close
        try:
            self._status = 200
            self.wfile.write(b"HTTP/1.1 200 OK\r\nServer: reflex\r\nContent-Type: text/event-stream\r\n"
                             b"Cache-Control: no-cache\r\n"
                             + (b"Transfer-Encoding: chunked\r\n\r\n" if chunked else b"Connection: close\r\n\r\n"))
            for line in lines:  # each step computes the next token
                if self._peer_gone():
                    raise ConnectionResetError("client closed the stream")
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line) if chunked else line)
            if chunked:
                self.wfile.write(b"0\r\n\r\n")
            else:
                self.close_connection = True
        finally:
            lines.close()
            stream.close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a stuck client never blocks exit
    request_queue_size = 64

    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # a client that hung up is not a server error
        _log(f"internal error on a connection from {client_address[0]}: {sys.exc_info()[1]!r}")


def start(args, timeline, load=_load) -> ThreadingHTTPServer:
    """Listen, then load the model on the worker thread; the caller runs serve_forever().
    `load(args, timeline) -> Engine` is replaceable for tests."""
    state = State(args.api_key)
    handler = type("ReflexHandler", (Handler,), {"state": state})
    server_cls = _Server
    if ":" in args.host:  # an IPv6 literal
        server_cls = type("_Server6", (_Server,), {"address_family": socket.AF_INET6})
    try:
        server = server_cls((args.host, args.port), handler)  # bind + listen before the model loads
    except OSError as e:
        raise ReflexError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
    host, port = server.server_address[:2]
    if timeline is not None:
        timeline.mark("listening")
    _log(f"listening on http://{host}:{port} (api key {'required' if state.api_key else 'off'})")
    if not state.api_key and args.host not in ("127.0.0.1", "localhost", "::1"):
        _log(f"warning: {args.host} is reachable from other machines and no --api-key is set")
    threading.Thread(target=_worker, args=(args, timeline, state, load), name="reflex-engine", daemon=True).start()
    server.state = state
    return server


def stop(server) -> None:
    """Close the listening socket and let the worker thread end (after the job it is on)."""
    server.server_close()
    server.state.jobs.put(None)


def main(args, timeline) -> int:
    server = start(args, timeline)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        stop(server)
    return 0
