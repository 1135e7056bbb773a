"""The model as a front end sees it: loading, ready, or failed; and health.

A failed load answers every request (health included) with one 503: the error's kind, the stage
that failed (the loader records it on the timeline), and the reason, with code
"model_load_failed". `serve --stay-up` and the Lambda handler keep answering it; without
`--stay-up`, serve exits instead.

A loaded engine whose last request failed on the engine's side (the model file truncated under
it, the device lost: `Engine.fault`) makes health (`GET /healthz`, the `ping` op) a 503 with code
"engine_failed" and that reason, until a request succeeds again; requests are still tried.
"""

from __future__ import annotations

import threading

from ..errors import ReflexError, printable
from .responses import Response


class ModelUnavailableError(ReflexError):
    """The model failed to load; every request is answered with this 503."""

    http_status = 503
    code = "model_load_failed"

    def __init__(self, cause: BaseException, stage: str | None):
        self.cause, self.stage = cause, stage or "unknown"
        self.kind = cause.kind if isinstance(cause, ReflexError) else "model_load_error"
        self.exit_code = cause.exit_code if isinstance(cause, ReflexError) else 1
        self.headers = {"Retry-After": "60"}
        self.extra = {"stage": self.stage}
        reason = str(cause) if isinstance(cause, ReflexError) else printable(f"{type(cause).__name__}: {cause}")
        super().__init__(f"the model failed to load at stage '{self.stage}': {reason}")


class ModelState:
    def __init__(self):
        self.engine = None
        self.failure: ModelUnavailableError | None = None
        self._settled = threading.Event()  # set once loaded or failed

    def ready(self, engine) -> None:
        self.engine = engine
        self._settled.set()

    def failed(self, cause: BaseException, stage: str | None) -> None:
        self.failure = ModelUnavailableError(cause, stage)
        self._settled.set()

    @property
    def loading(self) -> bool:
        return not self._settled.is_set()

    def wait_settled(self, timeout: float | None = None) -> bool:
        """Wait until the load ended either way; False on timeout."""
        return self._settled.wait(timeout)

    def wait(self):
        """The engine, once loaded; raises the 503 if the load failed."""
        self._settled.wait()
        if self.failure is not None:
            raise self.failure.with_traceback(None)  # the same instance each time: keep no old frames
        return self.engine


class EngineFaultError(ReflexError):
    """Health while the engine's last request failed on its side."""

    http_status = 503
    code = "engine_failed"

    def __init__(self, cause):
        self.kind = getattr(cause, "kind", "engine_error")
        self.headers = {"Retry-After": "60"}
        super().__init__(f"the engine failed its last request: {cause}")


def check_engine(engine) -> None:
    """Raise the 503 while the engine's last request failed on the engine's side."""
    fault = getattr(engine, "fault", None)
    if fault is not None:
        raise EngineFaultError(fault)


def health(state: ModelState) -> Response:
    """204 while loading, 200 with the model when ready; raises the 503 after a failed load or
    while the engine is faulted."""
    if state.loading:
        return Response(204)
    e = state.wait()
    check_engine(e)
    return Response(200, {"status": "ok", "model": e.model_name, "backend": e.runner.name,
                          "requests_served": e.requests_served})
