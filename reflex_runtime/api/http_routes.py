"""The HTTP routes and the order every HTTP front end answers in (`serve`, the Lambda handler).

    POST /v1/chat/completions   POST /v1/completions   POST /v1/system1
    GET  /v1/models             GET  /healthz (HEAD is GET without a body)

`HttpFront.respond()` decides, in this order:
1. a failed model load: 503 for every request (the Lambda contract; `serve --stay-up`);
2. the route: unknown path 404, wrong method 405 (with Allow);
3. /healthz: 204 loading, 200 ready (never needs the key);
4. the API key (auth.py): 401;
5. the engine (serve waits here while the model loads; a failed load is 503);
6. GET /v1/models; for POSTs: the body (the transport reads it: 400/408/411/413), JSON
   (json_wire.py), validation (openai_mapping.py): 400;
7. the call: prepared (tokenized) on the caller's thread, then run by the transport's `run`.
Every exception becomes an error Response (responses.py); the transport only frames it.
"""

from __future__ import annotations

import threading
from typing import Callable

from ..errors import ReflexError, RequestError
from . import auth, openai_mapping
from .json_wire import parse_object
from .model_state import ModelState, health
from .responses import Response, error_response

POST_ROUTES = {
    "/v1/chat/completions": openai_mapping.validate_chat,
    "/v1/completions": openai_mapping.validate_completion,
    "/v1/system1": openai_mapping.validate_system1,
}
GET_ROUTES = ("/healthz", "/v1/models")
ROUTE_LIST = "POST /v1/chat/completions, POST /v1/completions, POST /v1/system1, GET /v1/models, GET /healthz"
# Prompts tokenized at once on connection threads: more would only take turns on the GIL (and
# slow the generation running beside them).
PREPARE_SLOTS = 2


def allowed_methods(path: str) -> tuple[str, ...] | None:
    if path in POST_ROUTES:
        return ("POST",)
    if path in GET_ROUTES:
        return ("GET", "HEAD")
    return None


def header_map(headers) -> dict[str, str]:
    """Lower-case names; a repeated header's values joined with ", " (RFC 9110), so the request
    layer sees every value (auth refuses a joined credential)."""
    pairs = headers.items() if isinstance(headers, dict) else headers
    out: dict[str, str] = {}
    for name, value in pairs:
        name = name.lower()
        out[name] = f"{out[name]}, {value}" if name in out else value
    return out


class HttpFront:
    def __init__(self, state: ModelState, api_key: str | None, on_internal_error: Callable | None = None):
        self.state, self.api_key = state, api_key or None
        self.on_internal_error = on_internal_error  # called inside the except block (tracebacks work)
        self._prepare_slots = threading.BoundedSemaphore(PREPARE_SLOTS)

    def respond(self, method: str, path: str, headers, read_body: Callable[[], bytes | str],
                run: Callable | None = None) -> Response | None:
        """Answer one request. `headers`: (name, value) pairs as received, repeats included, or a
        dict. `read_body()` returns the body or raises RequestError; `run(call, engine)` runs a
        prepared call where the engine lives and returns its Response, or None once it has
        answered itself (serve writes on the connection thread)."""
        try:
            return self._respond(method, path, header_map(headers), read_body, run)
        except Exception as e:
            if not isinstance(e, ReflexError) and self.on_internal_error:
                self.on_internal_error(e)
            return error_response(e)

    def _respond(self, method, path, headers, read_body, run):
        if self.state.failure is not None:
            self.state.wait()  # raises the 503
        allowed = allowed_methods(path)
        if allowed is None:
            raise RequestError(f"no route {method[:16]} {path[:200]} (routes: {ROUTE_LIST})", status=404,
                               code="not_found")
        if method not in allowed:
            raise RequestError(f"{method[:16]} is not allowed on {path}", status=405, code="method_not_allowed",
                               headers={"Allow": ", ".join(allowed)})
        if path == "/healthz":
            return health(self.state)
        auth.check(headers.get("authorization"), self.api_key)
        engine = self.state.wait()
        if path == "/v1/models":
            return openai_mapping.models(engine)
        call = POST_ROUTES[path](engine, parse_object(read_body()))
        with self._prepare_slots:
            call.prepare(engine)
        if run is None:
            return call.run(engine)
        return run(call, engine)
