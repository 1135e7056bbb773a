"""The direct request shapes and their dispatch: JSON lines (`reflex stdio`/`uds`) and Lambda
direct invokes.

`{"op": "generate", "prompt" | "messages", "max_tokens", "temperature", "top_k", "top_p",
"min_p", "seed", "stop", "chat", "enable_thinking", "ignore_eos"}`,
`{"op": "system1", "prompt" | "messages", "candidates", "chat"}`, `{"op": "ping"}` and, on the
JSON-lines transports only, `{"op": "shutdown"}`. Transport keys (`op`, `id`, `stream`,
`authorization`) sit beside the fields; any other unknown field is an error naming it.

Order for every request: the op (unknown: 400, field "op"), then the API key (auth.py; `ping`
needs none), then the fields. `answer()` yields the response objects; the transport adds its
framing (an "id", a statusCode).
"""

from __future__ import annotations

from typing import Iterator, NamedTuple

from ..engine import Finished, GenerateRequest
from ..errors import RequestError
from ..sampling import SamplingParams
from . import auth
from .fields import (DEFAULT_LIMITS, brief, check_bool, check_candidates, check_int, check_keys, check_max_tokens,
                     check_num, check_stop, check_temperature, prompt_or_messages)

TRANSPORT_KEYS = frozenset({"op", "id", "stream", "authorization"})
GENERATE_KEYS = frozenset({"prompt", "messages", "max_tokens", "temperature", "top_k", "top_p", "min_p",
                           "seed", "stop", "chat", "enable_thinking", "ignore_eos"})
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


def parse_generate(d: dict, limits=DEFAULT_LIMITS, time_limit_s: float | None = None) -> GenerateRequest:
    check_keys(d, GENERATE_KEYS, TRANSPORT_KEYS, "generate")
    prompt, messages = prompt_or_messages(d, limits)
    sampling = SamplingParams(
        temperature=check_temperature(d, 0.0, 100.0),
        top_k=check_int(d, "top_k", 0, lo=0),
        top_p=check_num(d, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        min_p=check_num(d, "min_p", 0.0, 0.0, 1.0),
        seed=check_int(d, "seed", None, lo=0, hi=2**63 - 1),
    )
    return GenerateRequest(
        prompt=prompt, messages=messages,
        max_tokens=check_max_tokens(d, "max_tokens", min(DEFAULT_MAX_TOKENS, limits.max_new_tokens), limits),
        sampling=sampling, stop=check_stop(d, limits),
        chat=check_bool(d, "chat", False), enable_thinking=check_bool(d, "enable_thinking", None),
        ignore_eos=check_bool(d, "ignore_eos", False), time_limit_s=time_limit_s,
    )


def parse_system1(d: dict, limits=DEFAULT_LIMITS) -> System1Request:
    check_keys(d, SYSTEM1_KEYS, TRANSPORT_KEYS, "system1")
    prompt, messages = prompt_or_messages(d, limits)
    candidates = check_candidates(d.get("candidates"), limits)
    return System1Request(prompt, candidates, messages, check_bool(d, "chat", False))


def run_generate(engine, req: GenerateRequest) -> dict:
    """Run a generate request to the end: {"text", "finish_reason", "record"}."""
    for ev in engine.generate(req):
        if isinstance(ev, Finished):
            return {"text": ev.text, "finish_reason": ev.finish_reason, "record": ev.record}
    raise RuntimeError("the engine ended a generation without a Finished event")


def check_op(d: dict, ops: tuple[str, ...]) -> str:
    op = d.get("op")
    if op in ops:
        return op
    if op in LINE_OPS:
        raise RequestError(f"op {brief(op)} is only available on stdio and uds", field="op")
    raise RequestError(f"unknown op {brief(op)} (the ops are {', '.join(OPS)}; stdio and uds also take shutdown)",
                       field="op")


def answer(engine, d: dict, *, api_key: str | None = None, ops: tuple[str, ...] = OPS,
           deltas: bool = False) -> Iterator[dict]:
    """The response objects for one direct request. With `deltas` a `"stream": true` generate
    yields `{"delta": text}` objects before its result; the last object is always the result
    (`{"op": ..., ...}`). Errors raise (RequestError and the engine's own)."""
    op = check_op(d, ops)
    if op == "ping":
        yield {"op": "ping", "ok": True, "model": engine.model_name, "requests_served": engine.requests_served}
        return
    auth.check(d.get("authorization"), api_key)
    if op == "shutdown":
        yield {"op": "shutdown", "ok": True}
    elif op == "generate":
        stream = check_bool(d, "stream", False) and deltas
        req = parse_generate(d, engine.limits, engine.limits.request_timeout_s)
        gen = engine.generate(req)
        try:  # a write that fails (client gone) closes the generation at this token
            for ev in gen:
                if isinstance(ev, Finished):
                    yield {"op": "generate", "text": ev.text, "finish_reason": ev.finish_reason, "record": ev.record}
                elif stream:
                    yield {"delta": ev.text}
        finally:
            gen.close()
    else:
        r = parse_system1(d, engine.limits)
        yield {"op": "system1", **engine.system1(r.prompt, r.candidates, r.messages, r.chat)}
