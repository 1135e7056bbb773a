"""The direct request shapes and their dispatch: JSON lines (`reflex stdio`/`uds`) and Lambda
direct invokes.

`{"op": "generate", "prompt" | "messages", "max_tokens", "temperature", "top_k", "top_p",
"min_p", "seed", "stop", "chat", "enable_thinking", "ignore_eos", "logprobs", "response_format",
"tools", "tool_choice"}` (the last four as in the OpenAI mapping: `logprobs` is how many most likely
tokens to list per generated token, 0-20; the result then carries `"logprobs": [{"token_id",
"token", "logprob", "bytes", "top_logprobs"}]`, and with tools `"tool_calls"`),
`{"op": "system1", "prompt" | "messages", "candidates", "chat"}`, `{"op": "ping"}` and, on the
JSON-lines transports only, `{"op": "shutdown"}`. Transport keys (`op`, `id`, `stream`,
`authorization`) sit beside the fields; any other unknown field is an error naming it.

Order for every request: the op (unknown: 400, field "op"), then the API key (auth.py; `ping`
needs none), then the fields. `answer()` yields the response objects; the transport adds its
framing (an "id", a statusCode). `ping` is health: the 503 of a faulted engine (model_state.py).
Events Lambda parsed itself go through `answer_event()`, which first bounds their nesting as
json_wire.parse_object bounds every parsed line.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple

from ..engine import Finished, GenerateRequest
from ..errors import RequestError
from ..sampling import MAX_TOP_LOGPROBS
from ..sampling_defaults import MAX_TEMPERATURE, REFLEX_DEFAULTS
from . import auth
from .client_watch import ClientLeft
from .json_wire import check_depth
from .model_state import check_engine
from .fields import (DEFAULT_LIMITS, brief, check_bool, check_candidates, check_int, check_keys, check_max_tokens,
                     check_sampling, check_stop, prompt_or_messages)

TRANSPORT_KEYS = frozenset({"op", "id", "stream", "authorization"})
GENERATE_KEYS = frozenset({"prompt", "messages", "max_tokens", "temperature", "top_k", "top_p", "min_p",
                           "seed", "stop", "chat", "enable_thinking", "ignore_eos", "logprobs", "response_format",
                           "tools", "tool_choice"})
SYSTEM1_KEYS = frozenset({"prompt", "messages", "candidates", "chat"})
OPS = ("generate", "system1", "ping")  # every direct transport
LINE_OPS = OPS + ("shutdown",)  # JSON lines only: it ends the process
DEFAULT_MAX_TOKENS = 64


class System1Request(NamedTuple):
    """A validated system1 request: the arguments of Engine.system1."""

    prompt: str | None
    candidates: list[str]
    messages: list[dict] | None
    chat: bool


def parse_generate(d: dict, limits=DEFAULT_LIMITS, time_limit_s: float | None = None, engine=None) -> GenerateRequest:
    """A generate request. With the `engine`, sampling fields left out take the model's defaults
    (sampling_defaults.py) and tools are checked against its chat template; without it, reflex's
    defaults apply (the CLI checks a request this way before the model loads)."""
    check_keys(d, GENERATE_KEYS, TRANSPORT_KEYS, "generate")
    prompt, messages = prompt_or_messages(d, limits)
    grammar, tools = None, None
    if d.get("response_format") is not None or d.get("tools") or d.get("tool_choice") is not None:
        from .tools import check_response_format, check_tools

        plan = check_tools(d, engine) if d.get("tools") or d.get("tool_choice") is not None else None
        if plan is not None and plan.tools and messages is None and not check_bool(d, "chat", False):
            raise RequestError("'tools' need a chat request ('messages' or 'chat': true)", field="tools")
        grammar = check_response_format(d, limits)
        if plan is not None:
            if grammar is not None and plan.grammar is not None:
                raise RequestError("'response_format' cannot be combined with a 'tool_choice' that forces a call",
                                   field="response_format")
            grammar, tools = grammar or plan.grammar, plan.tools
    defaults = engine.sampling_defaults.params if engine is not None else REFLEX_DEFAULTS
    sampling = check_sampling(d, defaults, MAX_TEMPERATURE)
    return GenerateRequest(
        prompt=prompt, messages=messages,
        max_tokens=check_max_tokens(d, "max_tokens", min(DEFAULT_MAX_TOKENS, limits.max_new_tokens), limits),
        sampling=sampling, stop=check_stop(d, limits),
        chat=check_bool(d, "chat", False), enable_thinking=check_bool(d, "enable_thinking", None),
        ignore_eos=check_bool(d, "ignore_eos", False), time_limit_s=time_limit_s,
        logprobs=check_int(d, "logprobs", None, lo=0, hi=MAX_TOP_LOGPROBS), grammar=grammar, tools=tools,
    )


def parse_system1(d: dict, limits=DEFAULT_LIMITS) -> System1Request:
    check_keys(d, SYSTEM1_KEYS, TRANSPORT_KEYS, "system1")
    prompt, messages = prompt_or_messages(d, limits)
    candidates = check_candidates(d.get("candidates"), limits)
    return System1Request(prompt, candidates, messages, check_bool(d, "chat", False))


def run_generate(engine, req: GenerateRequest) -> dict:
    """Run a generate request to the end: {"text", "finish_reason", "record"} (+ "logprobs",
    "tool_calls" when asked)."""
    sampled = []
    for ev in engine.generate(req):
        if isinstance(ev, Finished):
            return _result(engine, req, ev, sampled)
        sampled += ev.logprobs or []
    raise RuntimeError("the engine ended a generation without a Finished event")


def _result(engine, req: GenerateRequest, ev: Finished, sampled: list) -> dict:
    out = {"text": ev.text, "finish_reason": ev.finish_reason}
    if req.logprobs is not None:
        out["logprobs"] = token_logprobs(engine.tokenizer, sampled)
    if req.tools:
        from .tools import HermesCalls

        content, calls = HermesCalls.parse(ev.text)
        if calls:
            out.update(text=content or "", tool_calls=calls,
                       finish_reason="tool_calls" if ev.finish_reason == "stop" else ev.finish_reason)
    out["record"] = ev.record
    return out


def token_logprobs(tokenizer, sampled: list) -> list[dict]:
    """The direct shape: OpenAI's chat entries with each token's id beside it."""
    from .logprobs import chat_entries

    out = []
    for s, e in zip(sampled, chat_entries(tokenizer, sampled)):
        e["top_logprobs"] = [{"token_id": i, **t} for i, t in zip(s.top_ids, e["top_logprobs"])]
        out.append({"token_id": s.token_id, **e})
    return out


def check_op(d: dict, ops: tuple[str, ...]) -> str:
    op = d.get("op")
    if op in ops:
        return op
    if op in LINE_OPS:
        raise RequestError(f"op {brief(op)} is only available on stdio and uds", field="op")
    raise RequestError(f"unknown op {brief(op)} (the ops are {', '.join(OPS)}; stdio and uds also take shutdown)",
                       field="op")


def answer_event(engine, event: dict, **kw) -> Iterator[dict]:
    """answer() for an event that did not come through json_wire.parse_object (Lambda's own)."""
    check_depth(event)
    return answer(engine, event, **kw)


def answer(engine, d: dict, *, api_key: str | None = None, ops: tuple[str, ...] = OPS,
           deltas: bool = False, gone=None) -> Iterator[dict]:
    """The response objects for one direct request. With `deltas` a `"stream": true` generate
    yields `{"delta": text}` objects before its result; the last object is always the result
    (`{"op": ..., ...}`). Errors raise (RequestError and the engine's own). `gone()`, when given,
    is asked before the generation and after each token: True ends it (ClientLeft)."""
    op = check_op(d, ops)
    if op == "ping":
        check_engine(engine)
        yield {"op": "ping", "ok": True, "model": engine.model_name, "requests_served": engine.requests_served}
        return
    auth.check(d.get("authorization"), api_key)
    if op == "shutdown":
        yield {"op": "shutdown", "ok": True}
    elif op == "generate":
        stream = check_bool(d, "stream", False) and deltas
        req = parse_generate(d, engine.limits, engine.limits.request_timeout_s, engine)
        if gone is not None and gone():
            raise ClientLeft("the client left before its generation started")
        gen = engine.generate(req, gone=gone)
        sampled = []
        try:  # a write that fails (client gone) closes the generation at this token
            for ev in gen:
                if gone is not None and gone():
                    raise ClientLeft("the client left during its generation")
                if isinstance(ev, Finished):
                    yield {"op": "generate", **_result(engine, req, ev, sampled)}
                    continue
                sampled += ev.logprobs or []
                if stream:
                    delta = {"delta": ev.text}
                    if req.logprobs is not None:
                        delta["logprobs"] = token_logprobs(engine.tokenizer, ev.logprobs or [])
                    yield delta
        finally:
            gen.close()
    else:
        r = parse_system1(d, engine.limits)
        yield {"op": "system1", **engine.system1(r.prompt, r.candidates, r.messages, r.chat)}
