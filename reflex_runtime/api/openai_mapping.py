"""OpenAI chat/completions (and reflex's system1 and models) bodies <-> engine calls.

Each endpoint is two steps, so a transport can keep slow work off the engine:
- `validate_*(engine, body)` checks the whole body (a RequestError names the field) and returns
  a Call; nothing is tokenized yet.
- `call.prepare(engine)` tokenizes the prompt (chat template included) and settles the default
  max_tokens. It touches no runner state: `serve` runs it on the connection's thread, beside a
  generation in progress.
- `call.run(engine, gone)` takes the engine: it starts the generation and pulls its first event
  before returning, so limit errors and the prefill happen before a transport commits to a 200
  and a stream. The caller holds a scheduler slot until the stream is exhausted or closed. `gone()`
  (a transport's check that its client is still there) is asked before the generation and, when
  the answer is not a stream, after every token: True ends it with client_watch.ClientLeft.
"""

from __future__ import annotations

import json
import os
import time
from typing import Iterator

from ..engine import Finished, GenerateRequest
from ..errors import RequestError
from ..sampling import MAX_TOP_LOGPROBS, SamplingParams
from . import logprobs as lp_shapes
from .client_watch import ClientLeft
from .direct_ops import parse_system1
from .fields import (BRIEF_CHARS, check_bool, check_int, check_max_tokens, check_messages, check_sampling, check_stop,
                     check_text)
from .responses import Response
from .tools import HermesCalls, check_response_format, check_tools

# Fields clients send that we accept but cannot honour unless they hold their neutral value.
_NEUTRAL = {
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
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
                             "frequency_penalty", "logit_bias", "response_format"}  # response_format: an extension
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions


# -- request checks -------------------------------------------------------------------------


def _check_fields(body: dict, allowed: frozenset) -> None:
    for k, v in body.items():
        if k in _IGNORED:
            continue
        if k not in allowed:
            raise RequestError(f"unrecognized request argument {k[:BRIEF_CHARS]!r}", field=k[:BRIEF_CHARS])
        if k in _NEUTRAL and v not in _NEUTRAL[k]:
            raise RequestError(f"'{k}' is not supported by this server (got {json.dumps(v)[:BRIEF_CHARS]})", field=k)
    _check_model(body)
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise RequestError(f"'n' must be 1: one choice per request is supported, got {n!r}", field="n")


def _check_model(body: dict) -> None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError("'model' must be a string", field="model")


def _sampling(engine, body: dict) -> SamplingParams:
    # Not OpenAI's temperature 1: a field left out takes the model's recommendation, else greedy,
    # as on every other front end (sampling_defaults.py). OpenAI's bound on temperature is 2.
    return check_sampling(body, engine.sampling_defaults.params, 2.0)


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


def _given_max(body: dict, keys: tuple[str, ...], limits) -> int | None:
    given = {k: check_max_tokens(body, k, None, limits) for k in keys if body.get(k) is not None}
    if len(set(given.values())) > 1:
        raise RequestError(f"give one of {' or '.join(repr(k) for k in keys)}, not both", field=keys[0])
    return next(iter(given.values()), None)


def _chat_logprobs(body: dict) -> int | None:
    """`logprobs` (true/false) and `top_logprobs` (0..20, only with logprobs): the k the runner gets."""
    want = check_bool(body, "logprobs", False)
    top = check_int(body, "top_logprobs", None, lo=0, hi=MAX_TOP_LOGPROBS)
    if top is not None and not want:
        raise RequestError("'top_logprobs' needs 'logprobs': true", field="top_logprobs")
    return (top or 0) if want else None


def _constraints(body: dict, engine):
    """(grammar, ToolPlan): response_format and tools/tool_choice, checked (400s name the field)."""
    plan = check_tools(body, engine)
    grammar = check_response_format(body, engine.limits)
    if grammar is not None and plan.grammar is not None:
        raise RequestError("'response_format' cannot be combined with a 'tool_choice' that forces a call",
                           field="response_format")
    return grammar or plan.grammar, plan


# -- calls ------------------------------------------------------------------------------------


class GenerateCall:
    """A validated chat or text completion: prepare() tokenizes, run() generates."""

    def __init__(self, req: GenerateRequest, kind: str, stream: bool, include_usage: bool,
                 max_given: bool, prompt_ids: list[int] | None = None, parse_tools: bool = False):
        self.req, self.kind, self.stream, self.include_usage = req, kind, stream, include_usage
        self.max_given, self.prompt_ids, self.parse_tools = max_given, prompt_ids, parse_tools

    def prepare(self, engine) -> None:
        r = self.req
        if self.prompt_ids is None:
            self.prompt_ids = engine.prompt_ids(r.prompt, r.messages, r.chat, r.enable_thinking, r.tools)
        if r.grammar is not None:  # build llguidance's vocabulary here, off the engine thread (once)
            from ..text.grammar import lltokenizer

            lltokenizer(engine.tokenizer, engine.config.vocab_size)
        if not self.max_given:  # the default: at most Limits.default_max_tokens, and what the context holds
            room = engine.runner.max_context - len(self.prompt_ids)
            if room < 1:
                raise RequestError(f"the prompt ({len(self.prompt_ids)} tokens) fills the context of "
                                   f"{engine.runner.max_context}", field="messages" if r.messages else "prompt")
            r.max_tokens = min(r.max_tokens, room)

    def run(self, engine, gone=None) -> Response:
        if self.prompt_ids is None:
            self.prepare(engine)
        return _respond(engine, self.req, self.prompt_ids, self.kind, self.stream, self.include_usage,
                        self.parse_tools, gone)


class System1Call:
    def __init__(self, req):
        self.req = req

    def prepare(self, engine) -> None:
        """Nothing: Engine.system1 tokenizes its candidates and prompt itself (bounded in characters)."""

    def run(self, engine, gone=None) -> Response:
        """One forward pass: nothing to stop half-way (`gone` is not asked)."""
        r = self.req
        result = engine.system1(prompt=r.prompt, candidates=r.candidates, messages=r.messages, chat=r.chat)
        return Response(200, {"object": "system1.result", "model": engine.model_name, **result})


def validate_chat(engine, body: dict) -> GenerateCall:
    limits = engine.limits
    _check_fields(body, CHAT_KEYS)
    if "messages" not in body:
        raise RequestError("'messages' is required", field="messages")
    messages = check_messages(body["messages"], limits)
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and (not isinstance(kwargs, dict) or set(kwargs) - {"enable_thinking"}):
        raise RequestError("'chat_template_kwargs' supports only 'enable_thinking'", field="chat_template_kwargs")
    thinking = check_bool(body, "enable_thinking", check_bool(kwargs or {}, "enable_thinking", None))
    sampling, stop, ignore_eos = _sampling(engine, body), check_stop(body, limits), check_bool(body, "ignore_eos", False)
    stream, include_usage = _stream_opts(body)
    max_new = _given_max(body, ("max_completion_tokens", "max_tokens"), limits)
    logprobs = _chat_logprobs(body)
    grammar, plan = _constraints(body, engine)
    req = GenerateRequest(messages=messages, max_tokens=max_new or min(limits.default_max_tokens, limits.max_new_tokens),
                          sampling=sampling, stop=stop, enable_thinking=thinking, ignore_eos=ignore_eos,
                          time_limit_s=limits.request_timeout_s, logprobs=logprobs, grammar=grammar, tools=plan.tools)
    return GenerateCall(req, "chat", stream, include_usage, max_new is not None, parse_tools=plan.parse)


def validate_completion(engine, body: dict) -> GenerateCall:
    limits = engine.limits
    _check_fields(body, COMPLETION_KEYS)
    sampling, stop, ignore_eos = _sampling(engine, body), check_stop(body, limits), check_bool(body, "ignore_eos", False)
    stream, include_usage = _stream_opts(body)
    prompt, ids = _completion_prompt(engine, body.get("prompt"))
    max_new = _given_max(body, ("max_tokens",), limits) or min(COMPLETION_DEFAULT_MAX_TOKENS, limits.max_new_tokens)
    # legacy logprobs: an integer, how many most likely tokens to list (0: only the chosen one's)
    logprobs = check_int(body, "logprobs", None, lo=0, hi=MAX_TOP_LOGPROBS)
    req = GenerateRequest(prompt=prompt, max_tokens=max_new, sampling=sampling, stop=stop, ignore_eos=ignore_eos,
                          time_limit_s=limits.request_timeout_s, logprobs=logprobs,
                          grammar=check_response_format(body, limits))
    return GenerateCall(req, "text", stream, include_usage, True, ids)


def _completion_prompt(engine, p) -> tuple[str, list[int] | None]:
    """(text, None) or ("", token ids); a list of exactly one of either is unwrapped (batches of
    prompts are not supported)."""
    limits = engine.limits
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]
    if isinstance(p, str):
        return check_text(p, "prompt", limits.max_prompt_chars) if p else p, None
    if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        vocab = engine.tokenizer.vocab_size
        if len(p) > limits.max_prompt_tokens:
            raise RequestError(f"prompt has {len(p)} tokens, the limit is {limits.max_prompt_tokens}", field="prompt")
        if not all(0 <= t < vocab for t in p):
            raise RequestError(f"'prompt' token ids must be in [0, {vocab})", field="prompt")
        return "", list(p)
    raise RequestError("'prompt' must be a string, a list of token ids, or a list of one of either "
                       "(several prompts per request are not supported)", field="prompt")


def validate_system1(engine, body: dict) -> System1Call:
    """Reflex's scoring endpoint: `{"prompt" | "messages", "candidates", "chat"}` (+ optional model)."""
    body = dict(body)
    _check_model(body)
    body.pop("model", None)
    return System1Call(parse_system1(body, engine.limits))


def models(engine) -> Response:
    return Response(200, {"object": "list", "data": [_model_card(engine)]})


def _model_card(engine) -> dict:
    try:
        created = int(os.stat(engine.gguf.path).st_mtime)
    except (OSError, AttributeError):
        created = 0
    return {"id": engine.model_name, "object": "model", "created": created, "owned_by": "reflex",
            "backend": engine.runner.name, "max_context": engine.runner.max_context,
            "sampling_defaults": engine.sampling_defaults.describe()}


# -- running a generation --------------------------------------------------------------------


def _respond(engine, req, ids: list[int] | None, kind: str, stream: bool, include_usage: bool,
             parse_tools: bool = False, gone=None) -> Response:
    if gone is not None and gone():
        raise ClientLeft("the client left before its generation started")
    gen = engine.generate(req, prompt_ids=ids, gone=gone)
    first = next(gen)  # engine checks + prefill: errors here are still a clean 4xx
    meta = {"id": ("chatcmpl-" if kind == "chat" else "cmpl-") + os.urandom(12).hex(),
            "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": int(time.time()), "model": engine.model_name}
    shape = _Shape(engine.tokenizer, kind, req.logprobs, parse_tools)
    if stream:
        return Response(200, stream=_Closing(_chunks(first, gen, meta, shape, include_usage), gen))
    parts, sampled, ev = [], [], first
    try:
        while not isinstance(ev, Finished):
            parts.append(ev.text)
            sampled += ev.logprobs or []
            if gone is not None and gone():
                raise ClientLeft("the client left during its generation")
            ev = next(gen)
    finally:
        gen.close()
    text = "".join(parts)
    choice = {"index": 0, "finish_reason": ev.finish_reason, "logprobs": shape.logprobs(sampled)}
    if kind == "chat":
        message = {"role": "assistant", "content": text}
        if parse_tools:
            content, calls = HermesCalls.parse(text)
            if calls:
                message = {"role": "assistant", "content": content, "tool_calls": calls}
                choice["finish_reason"] = _tool_finish(ev.finish_reason)
        choice["message"] = message
    else:
        choice["text"] = text
    return Response(200, {**meta, "choices": [choice], "usage": _usage(ev.record), "reflex": ev.record})


def _tool_finish(finish: str) -> str:
    return "tool_calls" if finish == "stop" else finish


class _Shape:
    """How one response spells logprobs (chat or legacy completions; None when not asked)."""

    def __init__(self, tokenizer, kind: str, k: int | None, parse_tools: bool):
        self.tok, self.kind, self.k, self.parse_tools = tokenizer, kind, k, parse_tools
        self.offset = 0  # legacy text_offset: characters of the completion so far

    def logprobs(self, sampled: list):
        if self.k is None:
            return None
        if self.kind == "chat":
            return lp_shapes.chat_logprobs(self.tok, sampled)
        obj, self.offset = lp_shapes.completion_logprobs(self.tok, sampled, self.offset, self.k > 0)
        return obj


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


def _chunks(first, gen, meta: dict, shape: _Shape, include_usage: bool) -> Iterator[dict]:
    """chat.completion.chunk / text_completion chunks; the last choice chunk carries the record.
    With tools, content is held while it could open a `<tool_call>` and each call goes out whole
    as one `tool_calls` delta (index, id, type, name and all its arguments)."""
    kind = shape.kind
    meta = {**meta, "object": "chat.completion.chunk" if kind == "chat" else "text_completion"}
    extra = {"usage": None} if include_usage else {}
    calls = HermesCalls() if shape.parse_tools else None

    def chunk(delta: dict | None, finish: str | None, sampled=None, text: str = "") -> dict:
        lps = shape.logprobs(sampled or []) if sampled is not None else None
        if kind == "chat":
            c = {"index": 0, "delta": delta or {}, "finish_reason": finish, "logprobs": lps}
        else:
            c = {"index": 0, "text": text, "finish_reason": finish, "logprobs": lps}
        return {**meta, "choices": [c], **extra}

    held = ""  # whitespace-only content between or after tool calls, sent only if more text follows

    def deltas(events) -> list[dict]:
        nonlocal held
        out = []
        for what, v in events:
            if what == "call":
                out.append({"tool_calls": [{"index": v[0], **v[1]}]})
            elif not v.strip():
                held += v
            else:
                out.append({"content": held + v})
                held = ""
        return out

    if kind == "chat":
        yield chunk({"role": "assistant", "content": ""}, None)
    ev = first
    while not isinstance(ev, Finished):
        sampled = ev.logprobs if shape.k is not None else None
        if kind != "chat":
            yield chunk(None, None, sampled, ev.text)
        elif calls is None:
            yield chunk({"content": ev.text}, None, sampled)
        else:
            out = deltas(calls.feed(ev.text))
            if not out and sampled:
                out = [{}]  # an empty delta still carries these tokens' logprobs
            for j, d in enumerate(out):  # logprobs ride on the first chunk of their text
                yield chunk(d, None, sampled if j == 0 else None)
        ev = next(gen)
    finish = ev.finish_reason
    if calls is not None:
        for d in deltas(calls.end()):
            yield chunk(d, None)
        if held and not calls.calls:
            yield chunk({"content": held}, None)
        if calls.calls:
            finish = _tool_finish(finish)
    yield {**chunk(None, finish), "reflex": ev.record}
    if include_usage:
        yield {**meta, "choices": [], "usage": _usage(ev.record)}


# -- one call, for callers that do not split the steps ---------------------------------------

VALIDATORS = {"chat": validate_chat, "completion": validate_completion, "system1": validate_system1}


def call(engine, endpoint: str, body: dict) -> Response:
    """validate + prepare + run, in one thread (the handler; tests)."""
    c = VALIDATORS[endpoint](engine, body)
    c.prepare(engine)
    return c.run(engine)


def chat_completions(engine, body: dict) -> Response:
    return call(engine, "chat", body)


def completions(engine, body: dict) -> Response:
    return call(engine, "completion", body)


def system1(engine, body: dict) -> Response:
    return call(engine, "system1", body)
