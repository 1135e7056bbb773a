"""One exception family. The CLI prints `str(err)` as one line and exits with `err.exit_code`
(2 is left to argparse's usage errors); the handler and the HTTP server answer with
`err.http_status` and a JSON body."""


class ReflexError(Exception):
    """Base of every error this package raises on purpose."""

    exit_code = 1
    http_status = 500
    kind = "reflex_error"

    def __str__(self) -> str:
        # Always one line: callers print it as is.
        return " ".join(super().__str__().split())


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


class RequestError(ReflexError):
    """The request is malformed or exceeds a limit. `field` names the culprit when known."""

    exit_code = 6
    http_status = 400
    kind = "invalid_request_error"

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class HubError(ReflexError):
    """A model reference could not be resolved or downloaded."""

    exit_code = 7
    http_status = 503
    kind = "model_fetch_error"
