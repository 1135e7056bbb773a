"""Every front end over the same fake engine (tests/fake_engine.py), behind one small interface,
so a test can send one input everywhere and compare what comes back.

- `ServeFront`: `reflex serve` in this process, over real HTTP on 127.0.0.1.
- `LinesFront`: the stdio/uds line loop (ipc.serve_lines) in this process.
- `HandlerFront`: handlers/app.py imported fresh, fed Function URL events (`http`) or direct
  invokes (`direct`).
Each `send` returns an Outcome: the status, and for errors the kind, message, field and code,
read from that transport's own error shape. `fronts_maker` builds all three on fresh fake engines;
`serve_process` runs a real `reflex serve` subprocess.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import http.client
import importlib
import io
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from reflex_runtime.frontends import ipc, serve
from reflex_runtime.api.json_wire import dumps

from fake_engine import make_engine

ROOT = Path(__file__).resolve().parents[1]
KEY = "test-key"
CTX = SimpleNamespace(function_name="reflex-fn", memory_limit_in_mb=3008, aws_request_id="req-1",
                      invoked_function_arn="arn:aws:lambda:us-east-1:123456789012:function:reflex-fn")


@dataclass(frozen=True)
class Outcome:
    status: int
    kind: str | None = None
    message: str | None = None
    field: str | None = None
    code: str | None = None
    body: object = None  # the success body (compared loosely), excluded from equality
    headers: object = None

    def same(self) -> tuple:
        return (self.status, self.kind, self.message, self.field, self.code)


def _from_http(status: int, body: dict | None, headers=None) -> Outcome:
    if body and "error" in body:
        e = body["error"]
        return Outcome(status, e["type"], e["message"], e["param"], e["code"], headers=headers)
    return Outcome(status, body=body, headers=headers)


def _from_line(obj: dict) -> Outcome:
    if "error" in obj:
        e = obj["error"]
        return Outcome(e["status"], e["type"], e["message"], e["field"], e["code"])
    return Outcome(200, body=obj)


class ServeFront:
    name = "serve"

    def __init__(self, engine=None, api_key=KEY, load_error: BaseException | None = None):
        self.engine = engine or make_engine()

        def load(args, timeline):
            if load_error is not None:
                raise load_error
            return self.engine

        args = SimpleNamespace(host="127.0.0.1", port=0, api_key=api_key, model=None, backend="cpu", ctx=None,
                               stay_up=True)
        self.srv = serve.start(args, None, load=load)
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.srv.state.model.wait_settled(10)

    def http(self, method: str, path: str, raw: bytes | None, credential: str | None) -> Outcome:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        h = {"Content-Type": "application/json"}
        if credential is not None:
            h["Authorization"] = credential
        c.request(method, path, body=raw, headers=h)
        r = c.getresponse()
        payload = r.read()
        c.close()
        body = json.loads(payload) if payload and r.getheader("Content-Type") == "application/json" else None
        return _from_http(r.status, body, dict(r.getheaders()))

    def close(self):
        self.srv.shutdown()
        serve.stop(self.srv)


class LinesFront:
    name = "stdio"

    def __init__(self, engine=None, api_key=KEY):
        self.engine, self.api_key = engine or make_engine(), api_key

    def lines(self, raw: bytes) -> list[dict]:
        """Every line answered to `raw`, through the same encoder the transports write with."""
        out = []
        ipc.serve_lines(self.engine, io.BytesIO(raw + b"\n").readline, lambda obj: out.append(json.loads(dumps(obj))),
                        self.api_key)
        return out

    def line(self, raw: bytes) -> Outcome:
        out = self.lines(raw)
        assert len(out) >= 1, "no answer line"
        return _from_line(out[-1])

    def direct(self, obj: dict, credential: str | None) -> Outcome:
        d = dict(obj)
        if credential is not None:
            d["authorization"] = credential
        return self.line(json.dumps(d).encode())


class HandlerFront:
    name = "handler"

    def __init__(self, monkeypatch, engine=None, api_key=KEY, load_error: BaseException | None = None, **env):
        import reflex_runtime.loader

        self.engine = engine or make_engine()

        def fake_load(model_ref=None, backend="auto", timeline=None, max_context=None, log=None, limits=None,
                      max_seqs=None, kv_tokens=None):
            if load_error is not None:
                timeline.begin("open_model")
                timeline.fail()
                raise load_error
            self.engine.timeline = timeline
            timeline.no_energy("fake engine: no GPU")
            return self.engine

        for k in ("REFLEX_MODEL", "REFLEX_API_KEY", "REFLEX_CTX", "REFLEX_REQUEST_TIMEOUT"):
            monkeypatch.delenv(k, raising=False)
        if api_key:
            monkeypatch.setenv("REFLEX_API_KEY", api_key)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        monkeypatch.setattr(reflex_runtime.loader, "load_engine", fake_load)
        logging.Logger.manager.loggerDict.pop(os.environ.get("POWERTOOLS_SERVICE_NAME", "reflex"), None)
        sys.modules.pop("handlers.app", None)
        self.app = importlib.import_module("handlers.app")
        self.template = json.loads((ROOT / "events" / "furl_chat.json").read_text())

    def event(self, method: str, path: str, raw: bytes | None, credential: str | None) -> dict:
        ev = copy.deepcopy(self.template)
        ev["rawPath"] = ev["requestContext"]["http"]["path"] = path
        ev["requestContext"]["http"]["method"] = method
        if credential is not None:
            ev["headers"]["authorization"] = credential
        if raw is None:
            ev.pop("body", None)
        else:
            try:
                ev["body"], ev["isBase64Encoded"] = raw.decode("utf-8"), False
            except UnicodeDecodeError:  # bytes that are not text travel as base64, as Lambda sends them
                ev["body"], ev["isBase64Encoded"] = base64.b64encode(raw).decode(), True
        return ev

    def http(self, method: str, path: str, raw: bytes | None, credential: str | None) -> Outcome:
        r = self.app.lambda_handler(self.event(method, path, raw, credential), CTX)
        r["body"].encode("utf-8")  # what the Function URL / API Gateway must send on
        ct = r["headers"].get("Content-Type")
        return _from_http(r["statusCode"], json.loads(r["body"]) if ct == "application/json" else None, r["headers"])

    def direct(self, obj: dict, credential: str | None) -> Outcome:
        ev = dict(obj)
        if credential is not None:
            ev["authorization"] = credential
        r = self.app.lambda_handler(ev, CTX)
        json.dumps(r, ensure_ascii=False).encode("utf-8")  # the runtime serializes the result
        status = r.pop("statusCode")
        return _from_http(status, r)

    def close(self):
        sys.modules.pop("handlers.app", None)


def sdk_over_handler(front: "HandlerFront", api_key: str = KEY, timeout: float = 600):
    """The official openai client whose HTTP goes to handlers/app.py as Function URL events (an
    httpx MockTransport: no socket), so SDK-level tests cover the handler as they cover serve."""
    import openai

    try:  # the SDK's HTTP library: httpx, renamed httpx2 in the openai 3.x line
        import httpx2 as httpx
    except ImportError:
        import httpx

    def handle(request):
        ev = front.event(request.method, request.url.path, request.content or None, request.headers.get("authorization"))
        r = front.app.lambda_handler(ev, CTX)
        body = base64.b64decode(r["body"]) if r.get("isBase64Encoded") else r["body"].encode("utf-8")
        return httpx.Response(r["statusCode"], headers=r.get("headers") or {}, content=body)

    return openai.OpenAI(base_url="http://handler.invalid/v1", api_key=api_key, max_retries=0, timeout=timeout,
                         http_client=httpx.Client(transport=httpx.MockTransport(handle)))


@contextlib.contextmanager
def sdk_clients(engine, timeout: float = 600):
    """{"serve": ..., "handler": ...}: the official openai client against serve (127.0.0.1) and
    against the handler (sdk_over_handler), both over `engine`."""
    import openai
    import pytest

    serve = ServeFront(engine=engine)
    mp = pytest.MonkeyPatch()
    handler = HandlerFront(mp, engine=engine)
    try:
        yield {"serve": openai.OpenAI(base_url=f"http://127.0.0.1:{serve.port}/v1", api_key=KEY, max_retries=0,
                                      timeout=timeout),
               "handler": sdk_over_handler(handler, timeout=timeout)}
    finally:
        serve.close()
        handler.close()
        mp.undo()


@contextlib.contextmanager
def fronts_maker(monkeypatch):
    """make(load_error=None, **engine_options) -> {"serve", "lines", "handler"}, each on its own
    fake engine (fake_engine.make_engine); all closed at the end."""
    made = []
    monkeypatch.setattr(serve, "_log", lambda msg: None)  # access lines arrive after the test moved on

    def make(load_error=None, **engine_options):
        f = {"serve": ServeFront(make_engine(**engine_options), load_error=load_error),
             "lines": LinesFront(make_engine(**engine_options)),
             "handler": HandlerFront(monkeypatch, make_engine(**engine_options), load_error=load_error)}
        made.append(f)
        return f

    try:
        yield make
    finally:
        for f in made:
            f["serve"].close()
            f["handler"].close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_process(model: str, *args: str, log=subprocess.DEVNULL, ready_s: float = 120):
    """(port, Popen) of `reflex serve --backend cpu -m model *args` on 127.0.0.1, once /healthz
    answers 200; terminated at the end."""
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "reflex_runtime.cli", "serve", "--backend", "cpu", "--port", str(port),
                          "-m", model, *args], stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.monotonic() + ready_s
        while True:
            assert p.poll() is None, "serve exited while loading"
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/healthz")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "serve did not become healthy"
            time.sleep(0.2)
        yield port, p
    finally:
        p.terminate()
        p.wait(10)
