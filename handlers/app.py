"""The serverless function: load the engine once per container (init phase), then serve events.

A thin transport over the request layer (reflex_runtime/api): this module reads Lambda events
and writes Lambda responses; what a request means, its errors, auth and health are decided there.
- Direct invokes `{"op": "generate" | "system1" | "ping", ...}` (api/direct_ops.py) answer
  `{"statusCode", ...result}`; with REFLEX_API_KEY set, every op but ping must carry
  `"authorization": "Bearer <key>"`.
- HTTP events from a Lambda Function URL, an API Gateway HTTP API (v2) or REST API (v1) go
  through api/http_routes.py: POST /v1/chat/completions, /v1/completions, /v1/system1; GET
  /v1/models, /healthz. Lambda buffers responses, so `stream: true` answers one complete
  text/event-stream body.
- A malformed event (no method or path, headers that are not strings, invalid base64) is a 400.

Every invocation logs one JSON line (powertools Logger, Lambda context and cold_start injected)
with its request record; the first also carries the cold-start record (process start -> first
token). Metrics go out as EMF in namespace "Reflex". Errors: bad input 400 naming the field; a
failed model load 503 with the stage and reason on every request; anything unexpected 500, logged
with its traceback. No exception leaves lambda_handler, so a request never kills the container.

Import cost, measured with `python -X importtime` (2-core dev box, warm page cache): powertools
Logger+Metrics ~25 ms. HTTP events need no event-handler import (routing is the request layer's).
"""

from reflex_runtime.measure.coldstart import Timeline

_TIMELINE = Timeline()  # first: the cold-start clock covers this module's own imports

import base64  # noqa: E402
import binascii  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

from aws_lambda_powertools import Logger, Metrics  # noqa: E402
from aws_lambda_powertools.metrics import MetricUnit  # noqa: E402

from reflex_runtime.api import direct_ops  # noqa: E402
from reflex_runtime.api.http_routes import HttpFront  # noqa: E402
from reflex_runtime.api.json_wire import MAX_BODY_BYTES, dumps  # noqa: E402
from reflex_runtime.api.model_state import ModelState  # noqa: E402
from reflex_runtime.api.responses import Response, error_response, sse_lines  # noqa: E402
from reflex_runtime.engine import CONTEXT_RANGE, DEFAULT_PARALLEL, KV_TOKENS_RANGE, PARALLEL_RANGE, QUEUE_RANGE, serving_limits  # noqa: E402
from reflex_runtime.envvars import env_number  # noqa: E402
from reflex_runtime.errors import ReflexError, RequestError  # noqa: E402

SERVICE = os.environ.get("POWERTOOLS_SERVICE_NAME", "reflex")
logger = Logger(service=SERVICE)
metrics = Metrics(namespace="Reflex", service=SERVICE)
# healthz and bad requests publish no metrics; powertools would warn about it on every one.
warnings.filterwarnings("ignore", message="No application metrics to publish")
API_KEY = os.environ.get("REFLEX_API_KEY") or None


def _number_env(name: str, kind, lo, hi, default):
    return env_number(name, kind, default,
                      lambda raw, _: ReflexError(f"{name} must be a number in [{lo}, {hi}], got {raw[:32]!r}"), lo, hi)


def _load() -> ModelState:
    """Runs once, at import: Lambda's init phase. A failure is kept and answered as a 503."""
    state = ModelState()
    try:
        from reflex_runtime.loader import load_engine

        ctx = _number_env("REFLEX_CTX", int, *CONTEXT_RANGE, None)
        timeout = _number_env("REFLEX_REQUEST_TIMEOUT", float, 0.0, 86400.0, None)
        parallel = _number_env("REFLEX_PARALLEL", int, *PARALLEL_RANGE, None)
        kv_tokens = _number_env("REFLEX_KV_TOKENS", int, *KV_TOKENS_RANGE, None)
        max_queue = _number_env("REFLEX_MAX_QUEUE", int, *QUEUE_RANGE, None)
        engine = load_engine(os.environ.get("REFLEX_MODEL") or None, os.environ.get("REFLEX_BACKEND", "auto"),
                             _TIMELINE, max_context=ctx, limits=serving_limits(timeout), max_seqs=parallel or DEFAULT_PARALLEL,
                             kv_tokens=kv_tokens,
                             log=lambda msg: logger.warning(msg, extra={"event": "backend_notice"}))
        # Every invocation goes through the scheduler: concurrent invocations of one container
        # (a runtime that allows them) are batched, and a full queue answers 429.
        engine.start_scheduler(parallel, max_queue)
    except Exception as e:  # noqa: BLE001 - every failure becomes a 503 that names it
        state.failed(e, _TIMELINE.failed_stage or "configuration")
        logger.error("model load failed", extra={"event": "load_failed", "stage": state.failure.stage,
                                                 "error": str(state.failure)},
                     exc_info=not isinstance(e, ReflexError))
        return state
    state.ready(engine)
    logger.info("engine ready", extra={
        "event": "engine_ready", "model": engine.model_name, "backend": engine.runner.name,
        "fallback_reason": engine.fallback_reason, "init_marks_ms": _TIMELINE.marks_ms()})
    return state


STATE = _load()
ENGINE, LOAD_FAILURE = STATE.engine, STATE.failure
FRONT = HttpFront(STATE, API_KEY, on_internal_error=lambda e: logger.exception(
    "request failed", extra={"event": "internal_error"}))

_invocations = 0
_request: dict = {}  # what the current invocation produced: route, record


# -- direct invokes ----------------------------------------------------------------------------


def _direct_body(r: Response) -> dict:
    return {"statusCode": r.status, **(r.body or {})}


def _direct(event: dict) -> dict:
    op = event.get("op")
    _request["route"] = f"op:{op[:32] if isinstance(op, str) else type(op).__name__}"
    try:
        engine = STATE.wait()  # a failed load: the 503
        result = {}
        for result in direct_ops.answer_event(engine, event, api_key=API_KEY):
            pass
        if result.get("record"):
            _request["record"] = result["record"]
        return {"statusCode": 200, **result}
    except Exception as e:  # noqa: BLE001
        if not isinstance(e, ReflexError):
            logger.exception("request failed", extra={"event": "internal_error"})
        return _direct_body(error_response(e))


# -- HTTP events ---------------------------------------------------------------------------------


def _malformed(what: str) -> RequestError:
    return RequestError(f"malformed HTTP event: {what}")


def read_http_event(event: dict, kind: str):
    """(method, path, header pairs, read_body) from an HTTP event; RequestError (400) when the
    event lacks what an HTTP request needs. REST API events list a repeated header's values in
    multiValueHeaders (`headers` keeps the last); v2 events join them with commas."""
    if kind == "rest_api":
        method, path = event.get("httpMethod"), event.get("path")
    else:
        rc = event["requestContext"]
        method, path = rc["http"].get("method"), event.get("rawPath")
        stage = rc.get("stage")
        # API Gateway v2 puts a named stage in front of the path; Function URLs have none ("$default").
        if isinstance(stage, str) and stage not in ("", "$default") and isinstance(path, str) \
                and (path == f"/{stage}" or path.startswith(f"/{stage}/")):
            path = path[len(stage) + 1:] or "/"
    if not isinstance(method, str) or not method:
        raise _malformed("no method")
    if not isinstance(path, str) or not path.startswith("/"):
        raise _malformed("no path")
    headers = event.get("headers") or {}
    if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise _malformed("'headers' must map names to string values")
    pairs = list(headers.items())
    multi = event.get("multiValueHeaders") if kind == "rest_api" else None
    if multi:
        if not isinstance(multi, dict) or not all(isinstance(k, str) and isinstance(v, list)
                                                  and all(isinstance(x, str) for x in v) for k, v in multi.items()):
            raise _malformed("'multiValueHeaders' must map names to lists of string values")
        pairs = [(k, x) for k, v in multi.items() for x in v]
    body, b64 = event.get("body"), event.get("isBase64Encoded")
    if body is not None and not isinstance(body, str):
        raise _malformed("'body' must be a string")

    def read_body() -> bytes | str:
        raw = body or ""
        if b64:
            try:
                data = base64.b64decode(raw, validate=True)
            except (binascii.Error, ValueError):
                raise RequestError("the body is not valid base64 (isBase64Encoded is true)") from None
            size = len(data)
        else:
            data, size = raw, len(raw.encode("utf-8", "surrogatepass"))
        if size > MAX_BODY_BYTES:
            raise RequestError(f"request body of {size} bytes exceeds the limit of {MAX_BODY_BYTES}", status=413)
        return data

    return method.upper(), path, pairs, read_body


def _records(chunks):
    """Pass stream chunks through, keeping the engine record the last one carries."""
    try:
        for c in chunks:
            if "reflex" in c:
                _request["record"] = c["reflex"]
            yield c
    finally:
        chunks.close()


def _http_result(r: Response, method: str = "GET") -> dict:
    """A Lambda proxy response (valid for Function URLs and API Gateway v1 and v2)."""
    headers = dict(r.headers)
    if r.stream is not None:
        body = b"".join(sse_lines(_records(r.stream))).decode("utf-8")
        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers}
    elif r.body is not None and r.status != 204:
        _request.setdefault("record", r.body.get("reflex") or r.body.get("record"))
        body = dumps(r.body).decode("utf-8")
        headers = {"Content-Type": "application/json", **headers}
    else:
        body = ""
    return {"statusCode": r.status, "headers": headers, "body": "" if method == "HEAD" else body,
            "isBase64Encoded": False}


def _http(event: dict, kind: str) -> dict:
    try:
        method, path, headers, read_body = read_http_event(event, kind)
    except RequestError as e:
        _request["route"] = "malformed"
        return _http_result(error_response(STATE.failure or e))
    _request["route"] = f"{method[:16]} {path[:200]}"
    return _http_result(FRONT.respond(method, path, headers, read_body), method)


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
    if not _TIMELINE.wait_for_meter(0):  # the device thread has not reported: record() would wait for it
        return {"marks_ms": _TIMELINE.marks_ms()}
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
        result = _http(event, kind)
    else:
        _request["route"] = "unknown"
        err = RequestError("unrecognized event: send {\"op\": \"generate\" | \"system1\" | \"ping\", ...} or an "
                           "HTTP event (Function URL, API Gateway v1/v2)", field="op")
        result = _direct_body(error_response(STATE.failure or err))
    fields = {"event": "request", "event_kind": kind, "route": _request.get("route"),
              "status": result.get("statusCode"), "duration_ms": round((time.perf_counter() - t0) * 1000, 3)}
    rec = _request.get("record")
    if rec:
        fields["reflex"] = rec
        _emit_metrics(rec)
    if first and not (rec and "coldstart" in rec):
        fields["coldstart"] = _timeline_so_far()  # the cold start, even when this request made no token
    if STATE.failure:
        fields["load_failure"] = {"stage": STATE.failure.stage, "error": str(STATE.failure.cause)}
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
        r = error_response(e)
        return _http_result(r) if isinstance(event, dict) and "requestContext" in event else _direct_body(r)
