"""`reflex serve`: HTTP edges in process (fake engine, tests/fake_engine.py), then the real server as a
subprocess on the embedded Gemma 3 270M (CPU backend), driven by the official openai SDK."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

openai = pytest.importorskip("openai")  # a dev dependency; GPU machines without it still collect this module
import pytest

from reflex_runtime.frontends import serve
from reflex_runtime.errors import ModelFileError

from fake_engine import REPLY, make_engine

KEY = "test-key"
CHAT = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0}


class Server:
    """serve.start() in this process with a replaceable loader."""

    def __init__(self, load, api_key=KEY, stay_up=True):
        args = SimpleNamespace(host="127.0.0.1", port=0, api_key=api_key, model=None, backend="cpu", ctx=None,
                               stay_up=stay_up)
        self.srv = serve.start(args, None, load=load)
        self.port = self.srv.server_address[1]
        self.thread = threading.Thread(target=self.srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def request(self, method, path, body=None, headers=None, key=KEY, raw=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        h = {"Authorization": f"Bearer {key}"} if key else {}
        h.update(headers or {})
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        payload = r.read()
        c.close()
        return r, (json.loads(payload) if payload and r.getheader("Content-Type") == "application/json" else payload)

    def close(self):
        self.srv.shutdown()
        serve.stop(self.srv)


@pytest.fixture(autouse=True)
def quiet(monkeypatch):
    # The access line is written after the answer, often after the test has moved on: drop it.
    monkeypatch.setattr(serve, "_log", lambda msg: None)


@pytest.fixture
def fake():
    engine = make_engine()
    s = Server(lambda args, tl: engine)
    s.engine = engine
    s.srv.state.model.wait_settled(5)
    yield s
    s.close()


# -- in process -------------------------------------------------------------------------------------


def test_healthz_204_while_loading_and_requests_wait_for_the_model():
    gate, engine = threading.Event(), make_engine()
    s = Server(lambda args, tl: (gate.wait(10), engine)[1])
    try:
        r, body = s.request("GET", "/healthz", key=None)
        assert r.status == 204 and body == b""
        answer = {}
        t = threading.Thread(target=lambda: answer.update(r=s.request("POST", "/v1/chat/completions", {**CHAT, "max_tokens": 5})))
        t.start()
        time.sleep(0.2)
        assert t.is_alive()  # waiting for the load, not refused
        gate.set()
        t.join(10)
        r, body = answer["r"]
        assert r.status == 200 and body["choices"][0]["message"]["content"] == "Hello"
        r, body = s.request("GET", "/healthz", key=None)
        assert r.status == 200 and body["status"] == "ok" and body["requests_served"] == 1
    finally:
        gate.set()
        s.close()


def test_load_failure_is_503_with_the_reason():
    def load(args, tl):
        raise ModelFileError("/models/x.gguf is not a GGUF file")

    s = Server(load)
    try:
        s.srv.state.model.wait_settled(5)
        r, body = s.request("GET", "/healthz", key=None)
        assert r.status == 503 and "not a GGUF" in body["error"]["message"]
        assert body["error"]["type"] == "model_file_error"
        r, body = s.request("POST", "/v1/completions", {"prompt": "a"})
        assert r.status == 503 and "not a GGUF" in body["error"]["message"]
    finally:
        s.close()


def test_without_stay_up_a_load_failure_stops_the_server(monkeypatch):
    def load(args, tl):
        raise ModelFileError("/models/x.gguf is not a GGUF file")

    monkeypatch.setattr(serve, "_load", load)
    args = SimpleNamespace(host="127.0.0.1", port=0, api_key=None, model=None, backend="cpu", ctx=None, stay_up=False)
    t0 = time.monotonic()
    with pytest.raises(ModelFileError, match="not a GGUF"):  # the CLI prints it as its one error line
        serve.main(args, None)
    assert time.monotonic() - t0 < 5


def _cli_serve(*extra, port):
    return subprocess.Popen([sys.executable, "-m", "reflex_runtime.cli", "serve", "--backend", "cpu", "--port", str(port),
                             *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_cli_serve_refuses_to_start_on_a_bad_model_unless_told_to_stay_up(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf at all")
    p = _cli_serve("--model", str(bad), port=_free_port())
    out, err = p.communicate(timeout=120)
    assert p.returncode == ModelFileError.exit_code and out == ""
    errors = [ln for ln in err.splitlines() if "error" in ln]
    assert len(errors) == 1 and errors[0] == err.splitlines()[-1] and errors[0].startswith("reflex: error: ")
    assert "not a GGUF" in errors[0] and "Traceback" not in err

    port = _free_port()
    p = _cli_serve("--model", str(bad), "--stay-up", port=port)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert p.poll() is None, p.stderr.read()
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/healthz")
                r = c.getresponse()
                status, body = r.status, r.read()
                c.close()
                if status == 503:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.1)
        err = json.loads(body)["error"]
        assert err["type"] == "model_file_error" and err["stage"] == "open_model" and "not a GGUF" in err["message"]
    finally:
        p.terminate()
        p.wait(10)


def test_routes_methods_and_head(fake):
    r, body = fake.request("GET", "/nope")
    assert r.status == 404 and body["error"]["code"] == "not_found"
    r, body = fake.request("GET", "/v1/chat/completions")
    assert r.status == 405 and r.getheader("Allow") == "POST" and "error" in body
    r, body = fake.request("DELETE", "/v1/models")
    assert r.status == 405 and r.getheader("Allow") == "GET, HEAD"
    r, body = fake.request("HEAD", "/v1/models")
    assert r.status == 200 and body == b"" and int(r.getheader("Content-Length")) > 0
    r, body = fake.request("HEAD", "/missing")
    assert r.status == 404 and body == b""
    r, body = fake.request("GET", "/v1/models?x=1")
    assert r.status == 200 and body["data"][0]["id"] == "fake-model"


def test_api_key(fake):
    for key in (None, "wrong"):
        r, body = fake.request("GET", "/v1/models", key=key)
        assert r.status == 401 and body["error"]["code"] == "invalid_api_key"
        assert r.getheader("WWW-Authenticate") == "Bearer"
    r, _ = fake.request("POST", "/v1/completions", {"prompt": "a"}, key="wrong")
    assert r.status == 401
    r, _ = fake.request("GET", "/healthz", key=None)  # probes need no key
    assert r.status == 200


def test_bad_bodies(fake):
    r, body = fake.request("POST", "/v1/chat/completions", raw=b"{nope")
    assert r.status == 400 and "invalid JSON" in body["error"]["message"]
    r, body = fake.request("POST", "/v1/chat/completions", {**CHAT, "n": 3})
    assert r.status == 400 and body["error"]["param"] == "n"
    r, body = fake.request("POST", "/v1/chat/completions", raw=b"x" * (serve.MAX_BODY + 1))
    assert r.status == 413 and r.getheader("Connection") == "close"
    # No Content-Length at all.
    c = socket.create_connection(("127.0.0.1", fake.port), timeout=10)
    c.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode())
    assert c.recv(100).startswith(b"HTTP/1.1 411 ")
    c.close()


def test_keep_alive_and_an_error_on_the_same_connection(fake):
    c = http.client.HTTPConnection("127.0.0.1", fake.port, timeout=10)
    h = {"Authorization": f"Bearer {KEY}"}
    for body, status in [({"prompt": "a", "max_tokens": 2}, 200), ({"prompt": 5}, 400), ({"prompt": "a", "max_tokens": 5}, 200)]:
        c.request("POST", "/v1/completions", body=json.dumps(body), headers=h)
        r = c.getresponse()
        assert r.status == status and json.loads(r.read())
    c.close()


def test_concurrent_clients_are_served_one_at_a_time_on_the_worker(fake):
    fake.engine.runner.delay = 0.002
    results = [None] * 4

    def client(i):
        results[i] = fake.request("POST", "/v1/chat/completions", {**CHAT, "max_tokens": 5 + i})

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for i, (r, body) in enumerate(results):
        assert r.status == 200 and body["choices"][0]["message"]["content"] == REPLY[:5 + i]
    assert fake.engine.runner.threads == {"reflex-engine"}  # ScriptedRunner also asserts no overlap


def test_stream_over_http(fake):
    c = http.client.HTTPConnection("127.0.0.1", fake.port, timeout=10)
    c.request("POST", "/v1/chat/completions", body=json.dumps({**CHAT, "stream": True}),
              headers={"Authorization": f"Bearer {KEY}"})
    r = c.getresponse()
    assert r.status == 200 and r.getheader("Content-Type") == "text/event-stream"
    assert r.getheader("Transfer-Encoding") == "chunked"
    events = [e for e in r.read().decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    text = "".join(json.loads(e[6:])["choices"][0]["delta"].get("content", "") for e in events[:-1])
    assert text == REPLY


def test_client_leaving_mid_stream_frees_the_engine(fake):
    runner = fake.engine.runner
    runner.delay = 0.05  # the reply takes ~1.7 s in full
    c = socket.create_connection(("127.0.0.1", fake.port), timeout=10)
    body = json.dumps({**CHAT, "stream": True}).encode()
    c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    got = b""
    while got.count(b"data: ") < 3:
        got += c.recv(4096)
    c.close()
    t0 = time.monotonic()
    while runner.closed < 1 and time.monotonic() - t0 < 5:
        time.sleep(0.01)
    assert runner.closed == 1 and time.monotonic() - t0 < 0.5
    assert runner.tokens < 10  # of the 34 the reply would take
    runner.delay = 0
    r, body = fake.request("POST", "/v1/completions", {"prompt": "a", "max_tokens": 3})
    assert r.status == 200 and body["choices"][0]["text"] == "Hel"


def test_sdk_against_the_fake(fake):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{fake.port}/v1", api_key=KEY, max_retries=0)
    out = client.chat.completions.create(model="fake-model", messages=CHAT["messages"], max_completion_tokens=5)
    assert out.choices[0].message.content == "Hello" and out.usage.completion_tokens == 5
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model="fake-model", messages=CHAT["messages"], n=2)
    assert ei.value.body["param"] == "n"
    assert [m.id for m in client.models.list()] == ["fake-model"]


# -- the real server -----------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    port = _free_port()
    log = open(tmp_path_factory.mktemp("serve") / "stderr.log", "w+b")
    p = subprocess.Popen([sys.executable, "-m", "reflex_runtime.cli", "serve", "--backend", "cpu", "--port", str(port),
                          "--api-key", KEY], stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert p.poll() is None, "serve exited"
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/healthz")
                status = c.getresponse().status
                c.close()
                if status == 200:
                    break
                assert status == 204
            except OSError:
                pass
            assert time.monotonic() < deadline, "serve did not become healthy"
            time.sleep(0.1)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0, timeout=120)
        yield SimpleNamespace(port=port, client=client, model=client.models.list().data[0].id, log=log)
    finally:
        p.terminate()
        p.wait(10)
        log.close()


CHAT_PROMPT = [{"role": "user", "content": "Name one color."}]
TEXT_PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def baseline(real):
    """Greedy answers, asked once, one at a time: the references the other tests compare against."""
    chat = real.client.chat.completions.create(model=real.model, messages=CHAT_PROMPT, max_tokens=6, temperature=0)
    text = real.client.completions.create(model=real.model, prompt=TEXT_PROMPT, max_tokens=6, temperature=0)
    return SimpleNamespace(chat=chat, text=text)


def test_real_chat_completion(real, baseline):
    out = baseline.chat
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-") and out.model == real.model
    msg = out.choices[0].message
    assert msg.role == "assistant" and isinstance(msg.content, str) and msg.content
    assert out.choices[0].finish_reason in ("stop", "length")
    assert 1 <= out.usage.completion_tokens <= 6 and out.usage.prompt_tokens > 5
    rec = out.model_extra["reflex"]
    assert rec["backend"] == "cpu" and rec["generated_tokens"] == out.usage.completion_tokens
    # The embedded Gemma 3 270M is a base model with no chat template: the record says so.
    assert rec["chat_template"] == "none (plain Gemma turn fallback)" and "no chat template" in rec["notice"]


def test_real_chat_stream_matches_non_stream(real, baseline):
    stream = real.client.chat.completions.create(model=real.model, messages=CHAT_PROMPT, max_tokens=6, temperature=0,
                                                 stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == baseline.chat.choices[0].message.content
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == baseline.chat.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == baseline.chat.usage.completion_tokens


def test_real_completion_and_stop_string(real, baseline):
    text = baseline.text.choices[0].text
    assert baseline.text.object == "text_completion" and len(text) >= 4
    # A stop string whose first occurrence is mid-text, so the cut is visible.
    cut = next(k for k in range(len(text) // 2, len(text) - 1) if text.find(text[k:k + 2]) == k)
    stop = text[cut:cut + 2]
    out = real.client.completions.create(model=real.model, prompt=TEXT_PROMPT, max_tokens=6, temperature=0, stop=[stop])
    assert out.choices[0].text == text[:cut] and out.choices[0].finish_reason == "stop"


def test_real_wrong_key_is_401(real):
    bad = openai.OpenAI(base_url=f"http://127.0.0.1:{real.port}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=real.model, messages=CHAT_PROMPT, max_tokens=2)


def test_real_malformed_body_is_400(real):
    c = http.client.HTTPConnection("127.0.0.1", real.port, timeout=10)
    c.request("POST", "/v1/chat/completions", body=b'{"messages": [', headers={"Authorization": f"Bearer {KEY}",
                                                                              "Content-Type": "application/json"})
    r = c.getresponse()
    body = json.loads(r.read())
    assert r.status == 400 and body["error"]["type"] == "invalid_request_error" and "invalid JSON" in body["error"]["message"]


def test_real_two_concurrent_clients(real, baseline):
    results = {}

    def chat():
        results["chat"] = real.client.chat.completions.create(model=real.model, messages=CHAT_PROMPT, max_tokens=6,
                                                              temperature=0)

    def text():
        results["text"] = real.client.completions.create(model=real.model, prompt=TEXT_PROMPT, max_tokens=6,
                                                         temperature=0)

    threads = [threading.Thread(target=chat), threading.Thread(target=text)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results["chat"].choices[0].message.content == baseline.chat.choices[0].message.content
    assert results["text"].choices[0].text == baseline.text.choices[0].text
