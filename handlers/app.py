"""The serverless function: load the engine once per container (init phase), then serve events.

Events: direct invokes `{"op": "generate" | "system1", ...}` (reflex_runtime.ops shapes) and HTTP
events from a Lambda Function URL, an API Gateway HTTP API (v2) or REST API (v1), routed by
powertools' event handler to reflex_runtime.openai_api: POST /v1/chat/completions,
/v1/completions, /v1/system1; GET /v1/models, /healthz. Lambda buffers responses, so
`stream: true` answers one complete text/event-stream body.

Every invocation logs one JSON line (powertools Logger, Lambda context and cold_start injected)
with its request record; the first also carries the cold-start record (process start -> first
token). Metrics go out as EMF in namespace "Reflex". Errors: bad input 400 naming the field; a
failed model load 503 with the stage and reason on every request; anything unexpected 500, logged
with its traceback. No exception leaves lambda_handler, so a request never kills the container.

Import cost, measured with `python -X importtime` (2-core dev box, warm page cache): powertools
Logger+Metrics ~25 ms; the HTTP event handler ~85 ms, so it is imported on the first HTTP event
only (a direct invoke never pays it).
"""

from reflex_runtime.coldstart import Timeline

_TIMELINE = Timeline()  # first: the cold-start clock covers this module's own imports

import base64  # noqa: E402
import hmac  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

from aws_lambda_powertools import Logger, Metrics  # noqa: E402
from aws_lambda_powertools.metrics import MetricUnit  # noqa: E402

from reflex_runtime import openai_api, ops  # noqa: E402
from reflex_runtime.errors import ReflexError, RequestError  # noqa: E402

SERVICE = os.environ.get("POWERTOOLS_SERVICE_NAME", "reflex")
logger = Logger(service=SERVICE)
metrics = Metrics(namespace="Reflex", service=SERVICE)
# healthz and bad requests publish no metrics; powertools would warn about it on every one.
warnings.filterwarnings("ignore", message="No application metrics to publish")

# The loader's main-thread marks, and the stage that runs after each (what failed, if it fails).
_STAGE_AFTER = {None: "resolve_model", "model_resolved": "open_model", "gguf_open": "tokenizer",
                "tokenizer": "load_weights", "weights_loaded": "engine"}


class LoadFailure:
    def __init__(self, stage: str, error: BaseException):
        self.stage, self.error = stage, error

    def response(self) -> openai_api.ApiResponse:
        e = self.error
        reason = str(e) if isinstance(e, ReflexError) else " ".join(f"{type(e).__name__}: {e}".split())
        r = openai_api.api_error(503, f"the model failed to load at stage '{self.stage}': {reason}",
                                 getattr(e, "kind", "model_load_error"), code="model_load_failed")
        r.body["error"]["stage"] = self.stage
        return r


def _int_env(name: str) -> int | None:
    v = os.environ.get(name, "").strip()
    return int(v) if v.isdigit() else None


def _load():
    """(engine, None) or (None, LoadFailure). Runs once, at import: Lambda's init phase."""
    try:
        from reflex_runtime.loader import load_engine

        engine = load_engine(os.environ.get("REFLEX_MODEL") or None, os.environ.get("REFLEX_BACKEND", "auto"),
                             _TIMELINE, max_context=_int_env("REFLEX_CTX"),
                             log=lambda msg: logger.warning(msg, extra={"event": "backend_notice"}))
    except Exception as e:  # noqa: BLE001 - every failure becomes a 503 that names it
        last = _TIMELINE.marks[-1][0] if _TIMELINE.marks else None
        failure = LoadFailure(_STAGE_AFTER.get(last, f"after_{last}"), e)
        logger.error("model load failed", extra={"event": "load_failed", "stage": failure.stage,
                                                 "error": failure.response().body["error"]["message"]},
                     exc_info=not isinstance(e, ReflexError))
        return None, failure
    logger.info("engine ready", extra={
        "event": "engine_ready", "model": engine.model_name, "backend": engine.runner.name,
        "fallback_reason": getattr(engine, "fallback_reason", None),
        "init_marks_ms": {name: round(t * 1000, 3) for name, t, _, _ in _TIMELINE.marks}})
    return engine, None


ENGINE, LOAD_FAILURE = _load()

_invocations = 0
_request: dict = {}  # what the current invocation produced: route, record


# -- responses ----------------------------------------------------------------------------------


def _error(e: BaseException) -> openai_api.ApiResponse:
    if not isinstance(e, ReflexError):
        logger.exception("request failed", extra={"event": "internal_error"})
    return openai_api.error_response(e)


def _direct_body(r: openai_api.ApiResponse) -> dict:
    return {"statusCode": r.status, **(r.body or {})}


def _plain_http(r: openai_api.ApiResponse) -> dict:
    """An HTTP response valid for every event shape, for when the resolver itself failed."""
    return {"statusCode": r.status, "headers": {"Content-Type": "application/json", **r.headers},
            "body": json.dumps(r.body), "isBase64Encoded": False}


def _records(chunks):
    """Pass stream chunks through, keeping the engine record the last one carries."""
    try:
        for c in chunks:
            if "reflex" in c:
                _request["record"] = c["reflex"]
            yield c
    finally:
        chunks.close()


def _http_response(r: openai_api.ApiResponse):
    from aws_lambda_powertools.event_handler import Response

    if r.stream is not None:
        body = b"".join(openai_api.sse_lines(_records(r.stream))).decode("utf-8")
        return Response(r.status, "text/event-stream", body, headers={"Cache-Control": "no-cache", **r.headers})
    if r.body:
        _request.setdefault("record", r.body.get("reflex") or r.body.get("record"))
    return Response(r.status, "application/json", json.dumps(r.body, ensure_ascii=False), headers=r.headers)


# -- direct invokes ----------------------------------------------------------------------------


def _direct(event: dict) -> dict:
    _request["route"] = f"op:{str(event.get('op'))[:32]}"
    if LOAD_FAILURE:
        return _direct_body(LOAD_FAILURE.response())
    try:
        op = event.get("op")
        if op == "generate":
            out = ops.run_generate(ENGINE, ops.parse_generate(event))
            _request["record"] = out["record"]
            return {"statusCode": 200, **out}
        if op == "system1":
            prompt, candidates, messages, chat = ops.parse_system1(event)
            res = ENGINE.system1(prompt=prompt, candidates=candidates, messages=messages, chat=chat)
            _request["record"] = res["record"]
            return {"statusCode": 200, **res}
        raise RequestError(f"unknown op {op!r}: use 'generate' or 'system1'", field="op")
    except Exception as e:  # noqa: BLE001
        return _direct_body(_error(e))


# -- HTTP events ---------------------------------------------------------------------------------

_resolvers: dict = {}


def _body(app) -> dict:
    ev = app.current_event
    raw = ev.body or ""
    data = base64.b64decode(raw) if ev.is_base64_encoded else raw.encode("utf-8", "surrogatepass")
    return openai_api.parse_json_body(data)


def _authorized(app) -> bool:
    key = os.environ.get("REFLEX_API_KEY")
    if not key:
        return True
    headers = {k.lower(): v for k, v in (app.current_event.get("headers") or {}).items()}
    got = headers.get("authorization", "")
    return hmac.compare_digest(got.encode(), f"Bearer {key}".encode())


def _make_resolver(kind: str):
    from aws_lambda_powertools import event_handler as eh

    cls = {"function_url": eh.LambdaFunctionUrlResolver, "http_api": eh.APIGatewayHttpResolver,
           "rest_api": eh.APIGatewayRestResolver}[kind]
    app = cls()

    def guarded(fn):
        """Load failure first, then the API key, then the endpoint; every error is JSON."""
        def route():
            try:
                if LOAD_FAILURE:
                    return _http_response(LOAD_FAILURE.response())
                if not _authorized(app):
                    return _http_response(openai_api.api_error(
                        401, "missing or invalid API key (send 'Authorization: Bearer <key>')",
                        code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"}))
                return _http_response(fn())
            except Exception as e:  # noqa: BLE001
                return _http_response(_error(e))
        route.__name__ = fn.__name__
        return route

    def post(fn):
        return lambda: fn(ENGINE, _body(app))

    app.post("/v1/chat/completions")(guarded(post(openai_api.chat_completions)))
    app.post("/v1/completions")(guarded(post(openai_api.completions)))
    app.post("/v1/system1")(guarded(post(openai_api.system1)))
    app.get("/v1/models")(guarded(lambda: openai_api.models(ENGINE)))

    @app.get("/healthz")
    def healthz():
        if LOAD_FAILURE:
            return _http_response(LOAD_FAILURE.response())
        return _http_response(openai_api.ApiResponse(200, {
            "status": "ok", "model": ENGINE.model_name, "backend": ENGINE.runner.name,
            "requests_served": ENGINE.requests_served}))

    @app.not_found
    def not_found(_exc):
        ev = app.current_event
        if LOAD_FAILURE:
            return _http_response(LOAD_FAILURE.response())
        return _http_response(openai_api.api_error(
            404, f"no route {ev.http_method} {ev.path[:200]} (routes: POST /v1/chat/completions, POST /v1/completions, "
                 "POST /v1/system1, GET /v1/models, GET /healthz)", code="not_found"))

    return app


def event_kind(event) -> str | None:
    """'direct', 'function_url', 'http_api', 'rest_api', or None for a shape we do not know."""
    if not isinstance(event, dict):
        return None
    rc = event.get("requestContext")
    if isinstance(rc, dict):
        if event.get("version") == "2.0" and isinstance(rc.get("http"), dict):
            return "function_url" if ".lambda-url." in str(rc.get("domainName", "")) else "http_api"
        if "httpMethod" in event:
            return "rest_api"  # REST APIs, and HTTP APIs on payload format 1.0
        return None
    return "direct" if "op" in event else None


def _http(event: dict, context, kind: str) -> dict:
    app = _resolvers.get(kind)
    if app is None:
        app = _resolvers[kind] = _make_resolver(kind)
    method = event.get("httpMethod") or event["requestContext"]["http"].get("method")
    _request["route"] = f"{method} {str(event.get('rawPath') or event.get('path'))[:200]}"
    return app.resolve(event, context)


# -- the entry point -------------------------------------------------------------------------------


def _emit_metrics(rec: dict) -> None:
    metrics.add_dimension("backend", str(rec.get("backend") or "unknown"))
    cs = rec.get("coldstart") or {}
    if cs.get("process_start_to_first_token_ms") is not None:
        metrics.add_metric("ProcessStartToFirstTokenMs", MetricUnit.Milliseconds, cs["process_start_to_first_token_ms"])
    if cs.get("joules_process_start_to_first_token") is not None:
        metrics.add_metric("JoulesProcessStartToFirstToken", MetricUnit.NoUnit, cs["joules_process_start_to_first_token"])
    metrics.add_metric("PromptTokens", MetricUnit.Count, rec.get("prompt_tokens") or 0)
    metrics.add_metric("GeneratedTokens", MetricUnit.Count, rec.get("generated_tokens") or 0)
    if rec.get("decode_tokens_per_s") is not None:
        metrics.add_metric("DecodeTokensPerSecond", MetricUnit.CountPerSecond, rec["decode_tokens_per_s"])


def _timeline_so_far() -> dict:
    if _TIMELINE.meter is None:  # the device thread has not reported: record() would wait for it
        return {"marks_ms": {n: round(t * 1000, 3) for n, t, _, _ in _TIMELINE.marks}}
    return _TIMELINE.record()


@metrics.log_metrics(capture_cold_start_metric=True)
@logger.inject_lambda_context(clear_state=True)
def _invoke(event, context):
    global _invocations
    first = _invocations == 0
    _invocations += 1
    _request.clear()
    t0 = time.perf_counter()
    kind = event_kind(event)
    if kind == "direct":
        result = _direct(event)
    elif kind is not None:
        result = _http(event, context, kind)
    else:
        _request["route"] = "unknown"
        err = openai_api.api_error(400, "unrecognized event: send {\"op\": \"generate\" | \"system1\", ...} or an "
                                        "HTTP event (Function URL, API Gateway v1/v2)", param="op")
        result = _direct_body(LOAD_FAILURE.response() if LOAD_FAILURE else err)
    fields = {"event": "request", "event_kind": kind, "route": _request.get("route"),
              "status": result.get("statusCode"), "duration_ms": round((time.perf_counter() - t0) * 1000, 3)}
    rec = _request.get("record")
    if rec:
        fields["reflex"] = rec
        _emit_metrics(rec)
    if first and not (rec and "coldstart" in rec):
        fields["coldstart"] = _timeline_so_far()  # the cold start, even when this request made no token
    if LOAD_FAILURE:
        fields["load_failure"] = {"stage": LOAD_FAILURE.stage, "error": str(LOAD_FAILURE.error)}
    logger.info("request", extra=fields)
    return result


def lambda_handler(event, context):
    try:
        return _invoke(event, context)
    except Exception as e:  # noqa: BLE001 - last resort: the container must survive any request
        try:
            logger.exception("handler failed", extra={"event": "handler_error"})
        except Exception:  # noqa: BLE001
            pass
        r = openai_api.error_response(e)
        return _plain_http(r) if isinstance(event, dict) and "requestContext" in event else _direct_body(r)
