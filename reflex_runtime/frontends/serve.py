"""`reflex serve`: the OpenAI-compatible HTTP server (stdlib http.server, no new dependency).

A thin transport over the request layer: reflex_runtime/api/http_routes.py decides every answer
(routes, auth, health, errors, validation); this module reads requests off sockets and writes
answers back.

The socket listens before the model loads, so a cold container accepts its first request at
once: /healthz answers 204 while loading, 200 when ready; other requests wait for the load. If
the load fails the server exits (one line, the error's exit code) unless `--stay-up` keeps it
answering 503 with the reason.

A worker thread loads the model and starts the engine's scheduler (scheduler.py): from then on
connection threads call the engine concurrently. Each reads, authenticates, validates and
tokenizes (at most api.http_routes.PREPARE_SLOTS at once), then runs its call and writes its own
answer, consuming its request's tokens as the scheduler batches them with the other requests'
(`--parallel` at once, `--max-queue` more waiting; beyond that 429 with Retry-After). A client
that disconnects is noticed before the generation starts and after every token
(api/client_watch.py), streaming or not; closing the generation frees its slot at the next step.

Bounds: bodies up to MAX_BODY bytes, received within BODY_TIMEOUT; the writes of one answer may
block WRITE_TIMEOUT seconds in total (a client that stops reading; a stream's send buffer is
small, so that starts after tens of KB), then its generation is closed; idle keep-alive
connections close after Handler.timeout; generations end at `--request-timeout` (engine.Limits),
the prompt's processing and the wait for a slot included.
"""

from __future__ import annotations

import re
import socket
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from ..api.client_watch import ClientLeft, StallBudget, small_send_buffer, socket_gone
from ..api.http_routes import HttpFront
from ..api.json_wire import MAX_BODY_BYTES, dumps
from ..api.model_state import ModelState
from ..api.responses import error_response, sse_lines
from ..errors import ReflexError, RequestError, printable

MAX_BODY = MAX_BODY_BYTES
BODY_TIMEOUT = 30.0  # seconds for a declared body to arrive
WRITE_TIMEOUT = 10.0  # seconds the writes of one answer may block, in total
GONE_CHECK_S = 0.05  # a stream looks for a client that left at most this often
_CONTENT_LENGTH = re.compile(r"[0-9]{1,15}")  # ASCII digits only: "²".isdigit() is True


def _log(msg: str) -> None:
    print(f"reflex serve: {printable(msg)}", file=sys.stderr, flush=True)


class State:
    """What the connection threads share: the model's state and the request layer."""

    def __init__(self, api_key: str | None):
        self.model = ModelState()
        self.front = HttpFront(self.model, api_key, on_internal_error=_log_internal)
        self.api_key = api_key or None


def _log_internal(err: BaseException) -> None:
    _log(f"internal error: {type(err).__name__}: {err}")


def _answer(call, engine, h: "Handler") -> None:
    """Run a prepared call on the connection thread and write its answer."""
    try:
        try:
            resp = call.run(engine, gone=lambda: socket_gone(h.connection))
        except ClientLeft:
            raise
        except Exception as e:
            if not isinstance(e, ReflexError):
                _log_internal(e)
            resp = error_response(e)
        h.connection.settimeout(WRITE_TIMEOUT)  # a client that stops reading cannot hold its slot
        if resp.stream is None:
            h.send(resp)
        else:
            h.write_stream(resp.stream, StallBudget(h.connection, WRITE_TIMEOUT))
    except (OSError, ClientLeft):  # the client is gone; its generation is closed already
        h.close_connection = True
    except Exception as e:  # a bug after the answer began: this connection cannot continue
        h.close_connection = True
        _log_internal(e)
    finally:
        try:
            h.connection.settimeout(h.timeout)
        except OSError:
            pass


def _load(args, timeline):
    from ..engine import DEFAULT_PARALLEL, serving_limits
    from ..loader import load_engine

    return load_engine(args.model, args.backend, timeline, max_context=args.ctx, log=_log,
                       limits=serving_limits(getattr(args, "request_timeout", None)),
                       max_seqs=getattr(args, "parallel", None) or DEFAULT_PARALLEL,
                       kv_tokens=getattr(args, "kv_tokens", None))


def _worker(args, timeline, state: State, load, server) -> None:
    try:
        engine = load(args, timeline)
    except Exception as e:
        state.model.failed(e, timeline.failed_stage if timeline is not None else None)
        if getattr(args, "stay_up", False):
            _log(f"model load failed (answering 503, --stay-up): {state.model.failure}")
        else:  # main() reports it as the one error line, then exits
            threading.Thread(target=server.shutdown, daemon=True).start()
        return
    sched = engine.start_scheduler(getattr(args, "parallel", None), getattr(args, "max_queue", None))
    if timeline is not None:
        _log(f"model ready: {engine.model_name} on {engine.runner.name} ({sched.max_seqs} at once), "
             f"process_start_to_ready_ms={round(timeline.mark('ready') * 1000, 3)}")
    state.model.ready(engine)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "reflex"
    sys_version = ""
    disable_nagle_algorithm = True  # small JSON writes must leave at once
    timeout = 300  # idle keep-alive connections and stalled readers give their thread back

    state: State  # set on the subclass start() builds

    # -- plumbing ---------------------------------------------------------------------------

    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        _log(format % args)

    def send(self, resp) -> None:
        status, body = resp.status, resp.body
        data = b"" if body is None or status == 204 else dumps(body)
        hdrs = {"Content-Type": "application/json"} if data else {}
        hdrs.update(resp.headers or {})
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
        self.wfile.write(head.encode("latin-1", "replace") + (b"" if self.command == "HEAD" else data))
        self._status = status

    def send_error(self, code, message=None, explain=None):
        """The base class calls this for unparseable requests and unknown methods: answer JSON."""
        self.close_connection = True
        if not getattr(self, "command", None):
            self.command = ""
        err = RequestError(message or HTTPStatus(code).phrase, status=code, headers={"Connection": "close"})
        self.send(error_response(err))

    # -- one request ------------------------------------------------------------------------

    def do_GET(self):
        self._route()

    do_POST = do_HEAD = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_GET

    def _route(self) -> None:
        t0 = time.perf_counter()
        self._status = 0
        self._drain_after = 0
        self._unread_body = self.headers.get("Content-Length", "0") not in ("", "0") or \
            "Transfer-Encoding" in self.headers
        path = urlsplit(self.path).path
        headers = [(k, _utf8(v) if k.lower() == "authorization" else v) for k, v in self.headers.items()]
        try:
            resp = self.state.front.respond(self.command, path, headers, self._read_body, self._run)
            if resp is not None:
                self.send(resp)
            if self._drain_after:
                self._drain(self._drain_after)
        except OSError:  # the client hung up or stalled past the timeout
            self.close_connection = True
        finally:
            _log(f'"{self.command} {path[:200]}" {self._status} {(time.perf_counter() - t0) * 1000:.1f}ms')

    def _read_body(self) -> bytes:
        """The request body; RequestError (411/400/413/408) when it cannot be had whole."""
        close = {"Connection": "close"}  # where the body ends is unknown: this connection cannot continue
        if "Transfer-Encoding" in self.headers:
            raise RequestError("chunked request bodies are not supported: send Content-Length", status=411,
                               headers=close)
        raw = self.headers.get("Content-Length")
        if raw is None:
            raise RequestError("Content-Length is required", status=411, headers=close)
        if not _CONTENT_LENGTH.fullmatch(raw.strip()):
            raise RequestError("invalid Content-Length", status=400, headers=close)
        n = int(raw)
        if n > MAX_BODY:
            self._drain_after = n  # after the answer: closing with unread data would reset it
            raise RequestError(f"request body of {n} bytes exceeds the limit of {MAX_BODY}", status=413,
                               headers=close)
        self.connection.settimeout(BODY_TIMEOUT)
        try:
            data = self.rfile.read(n)
        except TimeoutError:
            raise RequestError(f"the request body did not arrive within {BODY_TIMEOUT:g} s", status=408,
                               headers=close) from None
        finally:
            self.connection.settimeout(self.timeout)
        self._unread_body = False
        if len(data) < n:
            raise RequestError(f"the request body ended after {len(data)} of the {n} bytes of its Content-Length",
                               status=400, headers=close)
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

    def _run(self, call, engine) -> None:
        """Run a prepared call here and write its answer (api.http_routes: None, answered)."""
        _answer(call, engine, self)

    def write_stream(self, stream, budget: StallBudget) -> None:
        """Chunked SSE, one HTTP chunk per event, written as tokens come. A client that left is
        noticed within GONE_CHECK_S (or by the first write that fails), one that stops reading
        once `budget` is spent; closing the lines closes the generation."""
        lines = sse_lines(stream)
        chunked = self.request_version != "HTTP/1.0"  # 1.0 clients get a body that ends at close
        write = self.wfile.write
        small_send_buffer(self.connection)
        try:
            self._status = 200
            budget.write(write, b"HTTP/1.1 200 OK\r\nServer: reflex\r\nContent-Type: text/event-stream\r\n"
                         b"Cache-Control: no-cache\r\n"
                         + (b"Transfer-Encoding: chunked\r\n\r\n" if chunked else b"Connection: close\r\n\r\n"))
            self.connection.setblocking(False)  # budget.send: one syscall per event (_answer restores the timeout)
            checked = 0.0
            for line in lines:  # each step computes the next token
                now = time.monotonic()
                if now - checked >= GONE_CHECK_S:  # a poll per event was a syscall (and a GIL hand-off) per token
                    checked = now
                    if socket_gone(self.connection):
                        raise ClientLeft("client closed the stream")
                budget.send(b"%x\r\n%s\r\n" % (len(line), line) if chunked else line)
            if chunked:
                budget.send(b"0\r\n\r\n")
            else:
                self.close_connection = True
        finally:
            lines.close()
            stream.close()


def _utf8(value: str) -> str:
    """http.server decodes headers as latin-1; API keys are UTF-8."""
    return value.encode("latin-1", "replace").decode("utf-8", "replace")


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a stuck client never blocks exit
    request_queue_size = 64

    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # a client that hung up is not a server error
        _log(f"internal error on a connection from {client_address[0]}: {sys.exc_info()[1]!r}")


def start(args, timeline, load=None) -> ThreadingHTTPServer:
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
    _log(f"listening on http://{host}:{port} (api key {'required' if state.api_key else 'off'}; loading the model)")
    if not state.api_key and args.host not in ("127.0.0.1", "localhost", "::1"):
        _log(f"warning: {args.host} is reachable from other machines and no --api-key is set")
    server.state = state
    threading.Thread(target=_worker, args=(args, timeline, state, load or _load, server), name="reflex-load",
                     daemon=True).start()
    return server


def stop(server) -> None:
    """Close the listening socket and stop the engine's scheduler (after the step it is on)."""
    server.server_close()
    engine = server.state.model.engine
    if engine is not None:
        engine.stop_scheduler()


def main(args, timeline) -> int:
    server = start(args, timeline)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        stop(server)
    failure = server.state.model.failure
    if failure is not None:  # the load failed and --stay-up was not given
        raise failure.cause
    return 0
