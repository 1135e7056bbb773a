"""Hostile and careless requests on every front end (issue 20): each one gets a clean answer, and
none of them crashes a transport, stalls the engine or holds it for long. The same input goes
through `serve` (real HTTP), the stdio/uds line loop and the Lambda handler where it applies
(tests/front_ends.py); framing that only HTTP or only the socket has is tested there alone."""

from __future__ import annotations

import base64
import copy
import json
import os
import select
import socket
import tempfile
import threading
import time

import numpy as np
import pytest

from reflex_runtime import errors
from reflex_runtime.frontends import ipc, serve
from reflex_runtime.api import openai_mapping
from reflex_runtime.api.direct_ops import parse_generate
from reflex_runtime.api.json_wire import dumps
from reflex_runtime.api.model_state import ModelUnavailableError
from reflex_runtime.api.responses import line_error
from reflex_runtime.errors import ReflexError, RequestError
from reflex_runtime.sampling import SamplingParams

from fake_engine import REPLY, make_engine
from front_ends import CTX, KEY, HandlerFront, LinesFront, fronts_maker

AUTH = "Bearer " + KEY


@pytest.fixture
def make_fronts(monkeypatch):
    """make_fronts(**engine_options) -> {"serve", "lines", "handler"}, each on its own fake engine."""
    with fronts_maker(monkeypatch) as make:
        yield make


def _generate_everywhere(f, body: dict, endpoint="/v1/completions"):
    """A generation request as an OpenAI body over HTTP and as the direct generate op."""
    raw = json.dumps(body).encode()
    return {"serve": f["serve"].http("POST", endpoint, raw, AUTH),
            "handler_http": f["handler"].http("POST", endpoint, raw, AUTH),
            "lines": f["lines"].direct({"op": "generate", **body}, AUTH),
            "handler_direct": f["handler"].direct({"op": "generate", **body}, AUTH)}


def _record(o) -> dict:
    return o.body.get("reflex") or o.body.get("record")


# -- text that UTF-8 cannot carry ---------------------------------------------------------------


def test_lone_surrogates_in_requests_never_break_a_reply(make_fronts):
    f = make_fronts()
    body = {"prompt": "q\udc80", "candidates": ["Hello\udc80", "Bye"]}
    raw = json.dumps(body).encode()  # ASCII: the surrogates travel as \\udc80 escapes, as JSON allows
    outs = {"serve": f["serve"].http("POST", "/v1/system1", raw, AUTH),
            "handler_http": f["handler"].http("POST", "/v1/system1", raw, AUTH),
            "lines": f["lines"].direct({"op": "system1", **body}, AUTH),
            "handler_direct": f["handler"].direct({"op": "system1", **body}, AUTH)}
    for name, o in outs.items():
        assert o.status == 200, (name, o)
        assert o.body["candidates"][0]["text"] == "Hello\ufffd"  # echoed as the replacement character
    # ... and in a value an error message quotes
    bad = {"prompt": "q", "candidates": ["a"], "chat": "\udc80"}
    msgs = {f["serve"].http("POST", "/v1/system1", json.dumps(bad).encode(), AUTH).message,
            f["lines"].direct({"op": "system1", **bad}, AUTH).message,
            f["handler"].direct({"op": "system1", **bad}, AUTH).message}
    assert msgs == {"'chat' must be true or false, got '\\udc80'"}


def test_the_line_loop_survives_a_surrogate_field_name_and_answers_the_next_line():
    out = LinesFront(api_key=None).lines(json.dumps({"id": 1, "op": "ping", "\udc80": 1}).encode() + b"\n"
                                         + json.dumps({"id": 2, "op": "generate", "prompt": "hi", "\udc80": 1}).encode()
                                         + b"\n" + json.dumps({"id": 3, "op": "ping"}).encode())
    assert out[0]["op"] == "ping"  # ping ignores fields
    assert out[1]["error"]["message"] == "unknown field '\\udc80' in a generate request" and out[1]["id"] == 2
    assert out[2] == {"id": 3, "op": "ping", "ok": True, "model": "fake-model", "requests_served": 0}


def _reflex_error_classes():
    seen, todo = [], [ReflexError]
    while todo:
        c = todo.pop()
        seen.append(c)
        todo += c.__subclasses__()
    return seen


def test_every_reflex_error_is_one_encodable_line():
    assert {errors.ModelFileError, errors.RequestError, ModelUnavailableError} <= set(_reflex_error_classes())
    for cls in _reflex_error_classes():
        if cls is ModelUnavailableError:
            err = cls(errors.UnsupportedModelError("unsupported architecture 'qw\udcffen'\nmore"), "open_model")
        elif issubclass(cls, RequestError):
            err = cls("field '\udc80'\nbad", field="\udc80")
            assert err.field == "\\udc80"
        else:
            err = cls("unsupported architecture 'qw\udcffen'\nmore")
        text = str(err)
        text.encode("utf-8")
        assert "\n" not in text and "\\udc" in text, (cls, text)
        json.loads(dumps(line_error(None, err)))


def test_a_model_name_that_is_not_utf8_still_gets_its_503(make_fronts):
    f = make_fronts(load_error=errors.UnsupportedModelError("unsupported architecture 'qw\udcffen'"))
    for o in (f["serve"].http("GET", "/healthz", None, None), f["handler"].http("GET", "/healthz", None, None),
              f["handler"].direct({"op": "generate", "prompt": "x"}, AUTH)):
        assert o.status == 503 and o.kind == "unsupported_model" and o.code == "model_load_failed"
        assert "unsupported architecture 'qw\\udcffen'" in o.message


# -- sampling ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("t, expect", [(1e-40, 0.0), (5e-324, 0.0), (9.9e-6, 0.0), (1e-5, 1e-5), (0.7, 0.7)])
def test_tiny_temperatures_are_greedy_in_every_shape(t, expect):
    engine = make_engine()
    assert parse_generate({"prompt": "x", "temperature": t}).sampling.temperature == expect
    assert openai_mapping.validate_completion(engine, {"prompt": "x", "temperature": t}).req.sampling.temperature == expect
    assert openai_mapping.validate_chat(engine, {"messages": [{"role": "user", "content": "x"}],
                                                 "temperature": t}).req.sampling.temperature == expect


def test_the_rule_fixes_what_float32_broke():
    """Why the rule exists: 1e-40 sampled the LAST token id (logits / T overflowed float32)."""
    from reflex_runtime.reference.sampling import sample

    logits = np.random.default_rng(0).normal(size=100).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        assert sample(logits, SamplingParams(temperature=1e-40, seed=3), 0) == 99 != int(np.argmax(logits))
    t = parse_generate({"prompt": "x", "temperature": 1e-40, "seed": 3}).sampling
    assert sample(logits, t, 0) == int(np.argmax(logits))


def test_tiny_temperature_runs_greedy_on_every_front_end(make_fronts):
    f = make_fronts()
    for name, o in _generate_everywhere(f, {"prompt": "hi", "max_tokens": 3, "temperature": 1e-40}).items():
        assert o.status == 200 and _record(o)["seed"] is None, name  # greedy: no seed drawn
    for name, o in _generate_everywhere(f, {"prompt": "hi", "max_tokens": 3, "temperature": 0.5}).items():
        assert isinstance(_record(o)["seed"], int), name  # really sampled: a seed was drawn


# -- bounded work -------------------------------------------------------------------------------------


def test_oversized_prompts_are_refused_before_tokenizing(make_fronts):
    f = make_fronts()
    n = f["serve"].engine.limits.max_prompt_chars + 1
    for name, o in _generate_everywhere(f, {"prompt": "x" * n, "max_tokens": 2}).items():
        assert (o.status, o.field) == (400, "prompt") and f"has {n} characters" in o.message, name
    chat = {"messages": [{"role": "user", "content": "x" * (n // 2)}, {"role": "user", "content": "y" * (n // 2 + 1)}],
            "max_tokens": 2}
    for name in ("serve", "handler"):
        o = f[name].http("POST", "/v1/chat/completions", json.dumps(chat).encode(), AUTH)
        assert (o.status, o.field) == (400, "messages") and "characters" in o.message
    for front in f.values():
        assert front.engine.tokenizer.threads == set()  # nothing was tokenized


def test_serve_tokenizes_on_the_connection_thread_not_the_engine(make_fronts):
    f = make_fronts()
    o = f["serve"].http("POST", "/v1/chat/completions", json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}).encode(), AUTH)
    assert o.status == 200
    threads = f["serve"].engine.tokenizer.threads
    assert threads and "reflex-engine" not in threads  # the engine thread only generated
    assert f["serve"].engine.runner.threads == {"reflex-engine"}


def test_chat_without_max_tokens_gets_the_default_not_the_whole_context(make_fronts):
    f = make_fronts(default_max_tokens=5)
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
    for name in ("serve", "handler"):
        o = f[name].http("POST", "/v1/chat/completions", body, AUTH)
        assert o.status == 200 and o.body["choices"][0]["message"]["content"] == REPLY[:5]
        assert o.body["choices"][0]["finish_reason"] == "length" and o.body["usage"]["completion_tokens"] == 5


def test_a_generation_ends_at_the_request_timeout(make_fronts):
    f = make_fronts(delay=0.05, request_timeout_s=0.25)  # the whole reply would take ~1.7 s
    t0 = time.monotonic()
    outs = _generate_everywhere(f, {"prompt": "hi", "max_tokens": 200})
    assert time.monotonic() - t0 < 4 * 1.0
    for name, o in outs.items():
        rec = _record(o)
        assert o.status == 200 and rec["finish_reason"] == "length" and rec["time_limited"] is True, name
        assert 2 <= rec["generated_tokens"] <= 10, (name, rec["generated_tokens"])


def test_bodies_over_the_limit_are_413_on_the_handler_too(make_fronts):
    from reflex_runtime.api.json_wire import MAX_BODY_BYTES

    f = make_fronts()
    raw = json.dumps({"prompt": "x" * MAX_BODY_BYTES}).encode()
    for name in ("serve", "handler"):
        o = f[name].http("POST", "/v1/completions", raw, AUTH)
        assert o.status == 413 and "exceeds the limit" in o.message, name


# -- HTTP framing (serve) ------------------------------------------------------------------------------


def _raw_http(port: int, head: bytes, body: bytes = b"", half_close: bool = False, timeout: float = 10.0) -> bytes:
    c = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    c.sendall(head + body)
    if half_close:
        c.shutdown(socket.SHUT_WR)
    got = b""
    try:
        while True:
            chunk = c.recv(65536)
            if not chunk:
                break
            got += chunk
    finally:
        c.close()
    return got


def _status_and_error(reply: bytes) -> tuple[int, dict]:
    assert reply, "the server closed the connection without a reply"
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)["error"]


def _post_head(length: str) -> bytes:
    return (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: {AUTH}\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


@pytest.mark.parametrize("length", ["²", "-5", "1e3", "0x10", "12 34", "9" * 16])
def test_serve_answers_a_bad_content_length(make_fronts, length):
    f = make_fronts()
    status, err = _status_and_error(_raw_http(f["serve"].port, _post_head(length), b'{"prompt": "a"}'))
    assert status == 400 and err["message"] == "invalid Content-Length"


def test_serve_answers_a_body_shorter_than_its_content_length(make_fronts):
    f = make_fronts()
    status, err = _status_and_error(_raw_http(f["serve"].port, _post_head("100"), b'{"prompt": "a"}', half_close=True))
    assert status == 400 and err["message"] == "the request body ended after 15 of the 100 bytes of its Content-Length"


def test_serve_answers_a_body_that_never_comes(make_fronts, monkeypatch):
    monkeypatch.setattr(serve, "BODY_TIMEOUT", 0.5)
    f = make_fronts()
    t0 = time.monotonic()
    status, err = _status_and_error(_raw_http(f["serve"].port, _post_head("100"), b'{"prompt": "a"}'))
    assert status == 408 and "did not arrive within 0.5 s" in err["message"] and time.monotonic() - t0 < 5


# -- the unix socket -----------------------------------------------------------------------------------


def test_uds_an_idle_client_does_not_block_the_next_one():
    d = tempfile.mkdtemp(prefix="reflex-test-", dir="/tmp")
    path = os.path.join(d, "s.sock")
    sock = ipc.bind_socket(path)
    engine = make_engine()
    server = threading.Thread(target=ipc.serve_socket, args=(engine, sock, {"id": None, "op": "ready"}, None, 0.5),
                              daemon=True)
    server.start()
    try:
        idle = socket.socket(socket.AF_UNIX)
        idle.connect(path)
        f_idle = idle.makefile("rb")
        assert json.loads(f_idle.readline())["op"] == "ready"
        idle.sendall(b'{"id": 1, "op": "gen')  # half a line, then nothing
        time.sleep(1.0)  # alone, it may idle as long as it likes
        assert select.select([idle], [], [], 0)[0] == []
        other = socket.socket(socket.AF_UNIX)
        other.settimeout(10)
        other.connect(path)
        f_other = other.makefile("rb")
        t0 = time.monotonic()
        other.sendall(b'{"id": "b", "op": "ping"}\n')
        assert json.loads(f_other.readline())["op"] == "ready"
        assert json.loads(f_other.readline())["id"] == "b"
        assert time.monotonic() - t0 < 3.0
        kicked = json.loads(f_idle.readline())
        assert kicked["error"]["code"] == "idle_timeout" and kicked["error"]["status"] == 408
        assert f_idle.readline() == b""  # and closed
        other.sendall(b'{"id": "bye", "op": "shutdown"}\n')
        assert json.loads(f_other.readline())["op"] == "shutdown"
        server.join(5)
        assert not server.is_alive()
    finally:
        sock.close()
        os.unlink(path)
        os.rmdir(d)


# -- malformed Lambda events ---------------------------------------------------------------------------


def _furl(**changes) -> dict:
    from front_ends import ROOT

    ev = json.loads((ROOT / "events" / "furl_chat.json").read_text())
    ev["headers"]["authorization"] = AUTH
    for k, v in changes.items():
        ev[k] = v
    return ev


def _without(ev: dict, *path: str) -> dict:
    ev = copy.deepcopy(ev)
    d = ev
    for k in path[:-1]:
        d = d[k]
    del d[path[-1]]
    return ev


@pytest.mark.parametrize("name, ev, text", [
    ("invalid base64", _furl(body="@@not base64@@", isBase64Encoded=True), "not valid base64"),
    ("no rawPath", _without(_furl(), "rawPath"), "malformed HTTP event: no path"),
    ("no method", _without(_furl(), "requestContext", "http", "method"), "malformed HTTP event: no method"),
    ("empty requestContext.http", {**_furl(), "requestContext": {**_furl()["requestContext"], "http": {}}},
     "malformed HTTP event: no method"),
    ("a header value that is a number", _furl(headers={"authorization": 5}), "'headers' must map names to string"),
    ("a header value that is null", _furl(headers={"x-thing": None}), "'headers' must map names to string"),
    ("a body that is an object", _furl(body={"messages": []}), "'body' must be a string"),
    ("REST event without a path", {"httpMethod": "POST", "requestContext": {}, "body": "{}"}, "no path"),
])
def test_malformed_lambda_events_are_400(make_fronts, name, ev, text):
    app = make_fronts()["handler"].app
    r = app.lambda_handler(ev, CTX)
    err = json.loads(r["body"])["error"]
    assert r["statusCode"] == 400 and text in err["message"], (name, err)
    assert app.lambda_handler(_furl(), CTX)["statusCode"] == 200  # and the container serves on


def test_base64_bodies_still_work(make_fronts):
    app = make_fronts()["handler"].app
    ev = _furl()
    ev["body"], ev["isBase64Encoded"] = base64.b64encode(ev["body"].encode()).decode(), True
    assert app.lambda_handler(ev, CTX)["statusCode"] == 200


@pytest.mark.parametrize("env", [{"REFLEX_CTX": "0"}, {"REFLEX_CTX": "-1"}, {"REFLEX_CTX": "1000000000"},
                                 {"REFLEX_CTX": "lots"}, {"REFLEX_REQUEST_TIMEOUT": "nan"},
                                 {"REFLEX_KV_TOKENS": "0"}, {"REFLEX_KV_TOKENS": "many"}, {"REFLEX_PARALLEL": "0"}])
def test_bad_handler_settings_are_a_503_naming_them(monkeypatch, env):
    h = HandlerFront(monkeypatch, **env)
    try:
        (name,) = env
        for o in (h.http("GET", "/healthz", None, None), h.direct({"op": "generate", "prompt": "x"}, AUTH)):
            assert o.status == 503 and o.code == "model_load_failed", o
            assert o.message.startswith(f"the model failed to load at stage 'configuration': {name} must be")
    finally:
        h.close()
