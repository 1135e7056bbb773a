"""One exception family. The CLI prints `str(err)` as one line and exits with `err.exit_code`
(2 is left to argparse's usage errors); the handler and the HTTP server answer with
`err.http_status` and a JSON body."""


def printable(text: str) -> str:
    """`text` as one line that any transport can encode: whitespace runs become one space, and
    code points UTF-8 cannot carry (lone surrogates: from JSON escapes, or file bytes decoded
    with surrogateescape) are spelled as backslash escapes."""
    return " ".join(text.split()).encode("utf-8", "backslashreplace").decode("utf-8")


class ReflexError(Exception):
    """Base of every error this package raises on purpose."""

    exit_code = 1
    http_status = 500
    kind = "reflex_error"
    code: str | None = None  # a stable machine-readable reason where one helps (HTTP `code`)

    def __str__(self) -> str:
        # Always one line, always encodable: callers print and send it as is.
        return printable(super().__str__())


class ModelFileError(ReflexError):
    """The model file is missing, unreadable, not a GGUF, or malformed."""

    exit_code = 3
    http_status = 503
    kind = "model_file_error"


class UnsupportedModelError(ReflexError):
    """A well-formed GGUF that uses an architecture or quantization we do not run."""

    exit_code = 4
    http_status = 503
    kind = "unsupported_model"


class DeviceError(ReflexError):
    """A CUDA driver call failed or the kernels are missing for this GPU."""

    exit_code = 5
    http_status = 503
    kind = "device_error"


class DoesNotFit(DeviceError):
    """The model with its caches needs more GPU memory than is free (the message gives the sizes
    and what to lower). Not a reason to fall back to the CPU: the settings are."""

    code = "gpu_memory"


class BadSetting(DeviceError):
    """A REFLEX_* tuning variable that does not parse or is out of range: the message names it and
    what it takes. Not a reason to fall back to the CPU either."""

    code = "bad_setting"


class RequestError(ReflexError):
    """The request is malformed or exceeds a limit. `field` names the culprit when known."""

    exit_code = 6
    http_status = 400
    kind = "invalid_request_error"

    def __init__(self, message: str, field: str | None = None, *, status: int | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.field = printable(field) if field is not None else None
        if status is not None:  # a transport-level refusal: 401, 404, 405, 408, 411, 413
            self.http_status = status
        if code is not None:
            self.code = code
        self.headers = headers or {}


class NoRoom(ReflexError):
    """The KV cache's block pool cannot hold a request's tokens now (kvpool.py): the scheduler
    keeps it waiting until running sequences give their blocks back. Never reaches a client."""

    http_status = 503
    kind = "no_room"


class RequestTimeout(ReflexError):
    """A request ran past its time limit before it produced anything (the prompt was still being
    processed): 504, as a gateway reports a deadline it could not meet."""

    exit_code = 6
    http_status = 504
    kind = "timeout_error"
    code = "request_timeout"


class HubError(ReflexError):
    """A model reference could not be resolved or downloaded."""

    exit_code = 7
    http_status = 503
    kind = "model_fetch_error"


class Busy(ReflexError):
    """The scheduler's wait queue is full (engine.Limits.max_queue): 429, with Retry-After."""

    exit_code = 8
    http_status = 429
    kind = "rate_limit_error"
    code = "busy"

    def __init__(self, message: str, retry_after_s: float = 1.0):
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.headers = {"Retry-After": str(max(1, round(retry_after_s)))}
        self.extra = {"retry_after_s": retry_after_s}
