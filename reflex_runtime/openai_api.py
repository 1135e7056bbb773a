"""OpenAI chat/completions <-> engine mapping, transport-neutral (serve.py and handlers/app.py
adapt HTTP or Lambda events around it; see docs/INTERNALS.md).

Each entry point validates the whole body first (a RequestError names the field), then starts
the generation and pulls its first event before returning, so prompt/limit errors and the
prefill happen before a transport commits to a 200 and a stream. The caller must therefore hold
the engine (one request at a time) from the call until the stream is exhausted or closed.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Iterator

from .errors import ReflexError, RequestError
from .ops import check_bool, check_int, check_messages, check_num, check_stop, parse_system1

# Fields clients send that we accept but cannot honour unless they hold their neutral value.
_NEUTRAL = {
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "functions": (None, []),
    "tool_choice": (None, "none", "auto"),
    "function_call": (None, "none", "auto"),
    "response_format": (None, {"type": "text"}),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "top_logprobs": (None, 0),
    "logprobs": (None, False),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "audio": (None,),
}
# Fields we accept and ignore: they change nothing about the generated tokens.
_IGNORED = frozenset({"user", "store", "metadata", "service_tier", "parallel_tool_calls", "reasoning_effort",
                      "prompt_cache_key", "safety_identifier"})
_COMMON = frozenset({"model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop", "seed",
                     "top_k", "min_p", "ignore_eos"})  # top_k, min_p, ignore_eos: reflex extensions
CHAT_KEYS = _COMMON | {"messages", "max_completion_tokens", "enable_thinking", "chat_template_kwargs", "logprobs",
                       "top_logprobs", "presence_penalty", "frequency_penalty", "logit_bias", "tools", "functions",
                       "tool_choice", "function_call", "response_format", "modalities", "prediction", "audio"}
COMPLETION_KEYS = _COMMON | {"prompt", "logprobs", "echo", "suffix", "best_of", "presence_penalty",
                             "frequency_penalty", "logit_bias"}
MAX_LOGGED_PARAM = 64


@dataclass
class ApiResponse:
    status: int
    body: dict | None = None
    stream: Iterator[dict] | None = None  # chunk objects; sse_lines() frames them
    headers: dict = field(default_factory=dict)


def api_error(status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
              code: str | None = None, headers: dict | None = None) -> ApiResponse:
    return ApiResponse(status, {"error": {"message": message, "type": type_, "param": param, "code": code}},
                       headers=headers or {})


def error_response(err: BaseException) -> ApiResponse:
    """Our errors keep their status and kind; anything else is a bug: 500, one line."""
    if isinstance(err, ReflexError):
        return api_error(err.http_status, str(err), err.kind, getattr(err, "field", None))
    msg = " ".join(f"{type(err).__name__}: {err}".split())
    return api_error(500, f"internal error: {msg}", "internal_error")


def parse_json_body(raw: bytes) -> dict:
    """A request body as a JSON object. NaN/Infinity are refused: no field can use them."""
    def no_constants(name):
        raise RequestError(f"invalid JSON body: {name} is not allowed")

    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=no_constants)
    except UnicodeDecodeError:
        raise RequestError("invalid JSON body: not UTF-8") from None
    except json.JSONDecodeError as e:
        raise RequestError(f"invalid JSON body: {e.msg} at line {e.lineno} column {e.colno}") from None
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    return body


def sse_lines(chunks: Iterator[dict]) -> Iterator[bytes]:
    """Server-sent events in OpenAI's framing. An error mid-stream becomes one `{"error": ...}`
    event (the SDK raises it); closing this generator closes the generation behind it."""
    try:
        for chunk in chunks:
            yield b"data: " + _dumps(chunk) + b"\n\n"
    except Exception as e:  # headers are sent: the error can only travel in the stream
        yield b"data: " + _dumps(error_response(e).body) + b"\n\n"
        return
    finally:
        close = getattr(chunks, "close", None)
        if close:
            close()
    yield b"data: [DONE]\n\n"


def _dumps(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


# -- request checks -------------------------------------------------------------------------


def _check_fields(body: dict, allowed: frozenset) -> None:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    for k, v in body.items():
        if k in _IGNORED:
            continue
        if k not in allowed:
            raise RequestError(f"unrecognized request argument '{k[:MAX_LOGGED_PARAM]}'", field=k[:MAX_LOGGED_PARAM])
        if k in _NEUTRAL and v not in _NEUTRAL[k]:
            what = "logprobs not supported" if k in ("logprobs", "top_logprobs") else f"'{k}' is not supported"
            raise RequestError(f"{what} by this server (got {json.dumps(v)[:MAX_LOGGED_PARAM]})", field=k)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError("'model' must be a string", field="model")
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise RequestError(f"'n' must be 1: one choice per request is supported, got {n!r}", field="n")


def _sampling(body: dict):
    from .sampling import SamplingParams

    # OpenAI's defaults: temperature 1, top_p 1 (reflex's direct API defaults to greedy instead).
    return SamplingParams(
        temperature=check_num(body, "temperature", 1.0, 0.0, 2.0),
        top_k=check_int(body, "top_k", 0, lo=0),
        top_p=check_num(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        min_p=check_num(body, "min_p", 0.0, 0.0, 1.0),
        seed=check_int(body, "seed", None, lo=0, hi=2**63 - 1),
    )


def _stream_opts(body: dict) -> tuple[bool, bool]:
    stream = check_bool(body, "stream", False)
    opts = body.get("stream_options")
    if opts is None:
        return stream, False
    if not stream:
        raise RequestError("'stream_options' is only allowed when 'stream' is true", field="stream_options")
    if not isinstance(opts, dict) or set(opts) - {"include_usage", "include_obfuscation"}:
        raise RequestError("'stream_options' must be an object with 'include_usage'", field="stream_options")
    return stream, check_bool(opts, "include_usage", False)


def _given_max(body: dict, keys: tuple[str, ...]) -> int | None:
    given = {k: check_int(body, k, None, lo=1) for k in keys if body.get(k) is not None}
    if len(set(given.values())) > 1:
        raise RequestError(f"give one of {' or '.join(repr(k) for k in keys)}, not both", field=keys[0])
    return next(iter(given.values()), None)


def _room(engine, n_prompt: int) -> int:
    """No limit given: like OpenAI's chat, run to the end of the context (and the engine's limit)."""
    room = engine.runner.max_context - n_prompt
    if room < 1:
        raise RequestError(f"the prompt ({n_prompt} tokens) fills the context of {engine.runner.max_context}",
                           field="messages")
    return min(engine.limits.max_new_tokens, room)


# -- endpoints --------------------------------------------------------------------------------


def chat_completions(engine, body: dict) -> ApiResponse:
    from .engine import GenerateRequest

    _check_fields(body, CHAT_KEYS)
    if "messages" not in body:
        raise RequestError("'messages' is required", field="messages")
    messages = check_messages(body["messages"])
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and (not isinstance(kwargs, dict) or set(kwargs) - {"enable_thinking"}):
        raise RequestError("'chat_template_kwargs' supports only 'enable_thinking'", field="chat_template_kwargs")
    thinking = check_bool(body, "enable_thinking", check_bool(kwargs or {}, "enable_thinking", None))
    sampling, stop, ignore_eos = _sampling(body), check_stop(body), check_bool(body, "ignore_eos", False)
    stream, include_usage = _stream_opts(body)
    max_new, ids = _given_max(body, ("max_completion_tokens", "max_tokens")), None
    if max_new is None:  # the default depends on the prompt's length: tokenize it here
        ids = engine.prompt_ids(messages=messages, enable_thinking=thinking)
        max_new = _room(engine, len(ids))
    req = GenerateRequest(messages=messages, max_tokens=max_new, sampling=sampling, stop=stop,
                          enable_thinking=thinking, ignore_eos=ignore_eos)
    return _respond(engine, req, ids, "chat", stream, include_usage)


def completions(engine, body: dict) -> ApiResponse:
    from .engine import GenerateRequest

    _check_fields(body, COMPLETION_KEYS)
    sampling, stop, ignore_eos = _sampling(body), check_stop(body), check_bool(body, "ignore_eos", False)
    stream, include_usage = _stream_opts(body)
    prompt, ids = _completion_prompt(engine, body.get("prompt"))
    max_new = _given_max(body, ("max_tokens",)) or 16  # OpenAI's default for completions
    req = GenerateRequest(prompt=prompt, max_tokens=max_new, sampling=sampling, stop=stop, ignore_eos=ignore_eos)
    return _respond(engine, req, ids, "text", stream, include_usage)


def _completion_prompt(engine, p) -> tuple[str, list[int] | None]:
    """(text, None) or ("", token ids); a list of exactly one of either is unwrapped (batches of
    prompts are not supported). Text is tokenized inside Engine.generate, on its clock."""
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]
    if isinstance(p, str):
        return p, None
    if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        vocab = engine.tokenizer.vocab_size
        if not all(0 <= t < vocab for t in p):
            raise RequestError(f"'prompt' token ids must be in [0, {vocab})", field="prompt")
        if len(p) > engine.limits.max_prompt_tokens:
            raise RequestError(f"prompt has {len(p)} tokens, the limit is {engine.limits.max_prompt_tokens}", field="prompt")
        return "", list(p)
    raise RequestError("'prompt' must be a string, a list of token ids, or a list of one of either "
                       "(several prompts per request are not supported)", field="prompt")


def system1(engine, body: dict) -> ApiResponse:
    """Reflex's scoring endpoint: `{"prompt" | "messages", "candidates", "chat"}` (+ optional model)."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    body = dict(body)
    model = body.pop("model", None)
    if model is not None and not isinstance(model, str):
        raise RequestError("'model' must be a string", field="model")
    prompt, candidates, messages, chat = parse_system1(body)
    result = engine.system1(prompt=prompt, candidates=candidates, messages=messages, chat=chat)
    return ApiResponse(200, {"object": "system1.result", "model": engine.model_name, **result})


def models(engine) -> ApiResponse:
    return ApiResponse(200, {"object": "list", "data": [_model_card(engine)]})


def _model_card(engine) -> dict:
    try:
        created = int(os.stat(engine.gguf.path).st_mtime)
    except (OSError, AttributeError):
        created = 0
    return {"id": engine.model_name, "object": "model", "created": created, "owned_by": "reflex",
            "backend": engine.runner.name, "max_context": engine.runner.max_context}


# -- running a generation --------------------------------------------------------------------


def _respond(engine, req, ids: list[int] | None, kind: str, stream: bool, include_usage: bool) -> ApiResponse:
    from .engine import Finished

    gen = engine.generate(req, prompt_ids=ids)
    first = next(gen)  # engine checks + prefill: errors here are still a clean 4xx
    meta = {"id": ("chatcmpl-" if kind == "chat" else "cmpl-") + os.urandom(12).hex(),
            "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": int(time.time()), "model": engine.model_name}
    if stream:
        return ApiResponse(200, stream=_Closing(_chunks(first, gen, meta, kind, include_usage), gen))
    parts, ev = [], first
    try:
        while not isinstance(ev, Finished):
            parts.append(ev.text)
            ev = next(gen)
    finally:
        gen.close()
    text = "".join(parts)
    choice = {"index": 0, "finish_reason": ev.finish_reason, "logprobs": None}
    choice.update({"message": {"role": "assistant", "content": text}} if kind == "chat" else {"text": text})
    return ApiResponse(200, {**meta, "choices": [choice], "usage": _usage(ev.record), "reflex": ev.record})


def _usage(rec: dict) -> dict:
    p, c = rec["prompt_tokens"], rec["generated_tokens"]
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


class _Closing:
    """An iterator whose close() also closes the engine generation, even when it was never
    started (a generator's own `finally` only runs once it has begun)."""

    def __init__(self, it, gen):
        self._it, self._gen = it, gen

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._it)

    def close(self) -> None:
        self._it.close()
        self._gen.close()


def _chunks(first, gen, meta: dict, kind: str, include_usage: bool) -> Iterator[dict]:
    """chat.completion.chunk / text_completion chunks; the last choice chunk carries the record."""
    from .engine import Finished

    meta = {**meta, "object": "chat.completion.chunk" if kind == "chat" else "text_completion"}
    extra = {"usage": None} if include_usage else {}

    def chunk(text: str | None, finish: str | None, role: bool = False) -> dict:
        if kind == "chat":
            delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text is not None else {})
            c = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        else:
            c = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        return {**meta, "choices": [c], **extra}

    if kind == "chat":
        yield chunk(None, None, role=True)
    ev = first
    while not isinstance(ev, Finished):
        yield chunk(ev.text, None)
        ev = next(gen)
    yield {**chunk(None, ev.finish_reason), "reflex": ev.record}
    if include_usage:
        yield {**meta, "choices": [], "usage": _usage(ev.record)}
