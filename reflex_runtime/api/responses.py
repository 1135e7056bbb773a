"""What the request layer answers: `Response`, and errors in one shape per transport family.

Every failure becomes an `ErrorInfo` (status, kind, message, field, code, headers, extra) through
`describe()`, so the same input gets the same status/kind/message/field everywhere; only the
wrapping differs:
- HTTP family (serve, the handler's HTTP events and its direct invokes, which answer a
  statusCode): `{"error": {"message", "type", "param", "code", ...extra}}` with the status;
- JSON-lines family (stdio, uds): `{"id", "error": {"message", "type", "field", "code", "status",
  ...extra}}`.
Anything that is not a ReflexError is a bug: 500, kind "internal_error", one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as _default
from typing import Iterator

from ..errors import ReflexError, printable
from .json_wire import dumps


@dataclass
class Response:
    status: int
    body: dict | None = None
    stream: Iterator[dict] | None = None  # chunk objects; sse_lines() frames them
    headers: dict = _default(default_factory=dict)


@dataclass
class ErrorInfo:
    status: int
    kind: str
    message: str
    field: str | None = None
    code: str | None = None
    headers: dict = _default(default_factory=dict)
    extra: dict = _default(default_factory=dict)  # e.g. {"stage": ...} for a failed model load


def describe(err: BaseException) -> ErrorInfo:
    if isinstance(err, ReflexError):
        headers = dict(getattr(err, "headers", None) or {})
        if err.http_status == 401:
            headers.setdefault("WWW-Authenticate", "Bearer")
        return ErrorInfo(err.http_status, err.kind, str(err), getattr(err, "field", None), err.code, headers,
                         dict(getattr(err, "extra", None) or {}))
    return ErrorInfo(500, "internal_error", "internal error: " + printable(f"{type(err).__name__}: {err}"))


def http_error_body(info: ErrorInfo) -> dict:
    return {"error": {"message": info.message, "type": info.kind, "param": info.field, "code": info.code, **info.extra}}


def error_response(err: BaseException) -> Response:
    info = describe(err)
    return Response(info.status, http_error_body(info), headers=info.headers)


def line_error(rid, err: BaseException) -> dict:
    info = describe(err)
    return {"id": rid, "error": {"message": info.message, "type": info.kind, "field": info.field, "code": info.code,
                                 "status": info.status, **info.extra}}


def sse_lines(chunks: Iterator[dict]) -> Iterator[bytes]:
    """Server-sent events in OpenAI's framing. An error mid-stream becomes one `{"error": ...}`
    event (the SDK raises it); closing this generator closes the generation behind it."""
    try:
        for chunk in chunks:
            yield b"data: " + dumps(chunk) + b"\n\n"
    except Exception as e:  # headers are sent: the error can only travel in the stream
        yield b"data: " + dumps(http_error_body(describe(e))) + b"\n\n"
        return
    finally:
        close = getattr(chunks, "close", None)
        if close:
            close()
    yield b"data: [DONE]\n\n"
