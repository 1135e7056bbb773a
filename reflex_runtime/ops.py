"""Request mapping shared by every transport (IPC, HTTP, the serverless handler).

`parse_generate` and `parse_system1` turn the direct JSON shapes into engine calls; the field
checkers below are reused by openai_api.py. Every wrong field raises RequestError(field=...) so
a transport can name the culprit. Parsing never touches the engine (cheap, safe to run before
taking the engine); `run_generate` is the one helper here that does.
"""

from __future__ import annotations

import math

from .errors import RequestError

# Keys a transport puts on a request for its own use; parsing ignores them.
TRANSPORT_KEYS = frozenset({"op", "id", "stream"})
GENERATE_KEYS = frozenset({"prompt", "messages", "max_tokens", "temperature", "top_k", "top_p", "min_p",
                           "seed", "stop", "chat", "enable_thinking", "ignore_eos"})
SYSTEM1_KEYS = frozenset({"prompt", "messages", "candidates", "chat"})
ROLES = ("system", "developer", "user", "assistant")
MESSAGE_KEYS = frozenset({"role", "content", "name"})
MAX_STOP_STRINGS = 8  # the engine's Limits.max_stop_strings default; the engine checks its own too


# -- field checkers (each returns the value, or raises naming the field) ---------------------


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_int(d: dict, key: str, default, lo: int | None = None, hi: int | None = None, field: str | None = None):
    v = d.get(key)
    if v is None:
        return default
    lim = f" in [{lo}, {hi}]" if hi is not None else (f" >= {lo}" if lo is not None else "")
    if not _is_int(v) or (lo is not None and v < lo) or (hi is not None and v > hi):
        raise RequestError(f"'{field or key}' must be an integer{lim}, got {v!r}", field=field or key)
    return v


def check_num(d: dict, key: str, default, lo: float, hi: float, lo_open: bool = False):
    v = d.get(key)
    if v is None:
        return default
    ok = _is_num(v) and (v > lo if lo_open else v >= lo) and v <= hi
    if not ok:
        span = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise RequestError(f"'{key}' must be a number in {span}, got {v!r}", field=key)
    return float(v)


def check_bool(d: dict, key: str, default):
    v = d.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise RequestError(f"'{key}' must be true or false, got {v!r}", field=key)
    return v


def check_stop(d: dict, key: str = "stop") -> tuple[str, ...]:
    """A string or a list of non-empty strings (OpenAI accepts both)."""
    v = d.get(key)
    if v is None:
        return ()
    if isinstance(v, str):
        v = [v]
    if (not isinstance(v, list) or len(v) > MAX_STOP_STRINGS
            or not all(isinstance(s, str) and s for s in v)):
        raise RequestError(f"'{key}' must be a non-empty string or a list of up to {MAX_STOP_STRINGS} non-empty strings",
                           field=key)
    return tuple(v)


def _content_text(content, where: str) -> str:
    """A message's content as one string: a string, or a list of OpenAI text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(f"'{where}.content[{j}]' must be a text part {{\"type\": \"text\", \"text\": ...}} "
                                   "(only text content is supported)", field=f"{where}.content")
            texts.append(part["text"])
        return "\n".join(texts)
    raise RequestError(f"'{where}.content' must be a string or a list of text parts", field=f"{where}.content")


def check_messages(v, key: str = "messages") -> list[dict]:
    """A non-empty list of {role, content}; returns plain {role, content: str} dicts for the template.
    `developer` becomes `system` (chat templates know only the older name)."""
    if not isinstance(v, list) or not v:
        raise RequestError(f"'{key}' must be a non-empty list of messages", field=key)
    out = []
    for i, m in enumerate(v):
        where = f"{key}[{i}]"
        if not isinstance(m, dict):
            raise RequestError(f"'{where}' must be an object with 'role' and 'content'", field=where)
        role = m.get("role")
        if role not in ROLES:
            raise RequestError(f"'{where}.role' must be one of {', '.join(ROLES)}, got {role!r}", field=f"{where}.role")
        # Clients often echo a previous response's message back, with null tool fields: allow nulls.
        for k, val in m.items():
            if k not in MESSAGE_KEYS and val not in (None, [], {}):
                raise RequestError(f"'{where}.{k}' is not supported", field=f"{where}.{k}")
        name = m.get("name")
        if name is not None and not isinstance(name, str):
            raise RequestError(f"'{where}.name' must be a string", field=f"{where}.name")
        if "content" not in m or m["content"] is None:
            raise RequestError(f"'{where}.content' is required", field=f"{where}.content")
        out.append({"role": "system" if role == "developer" else role, "content": _content_text(m["content"], where)})
    return out


def _check_keys(d, allowed: frozenset, what: str) -> None:
    if not isinstance(d, dict):
        raise RequestError(f"a {what} request must be a JSON object", field=None)
    for k in d:
        if k not in allowed and k not in TRANSPORT_KEYS:
            raise RequestError(f"unknown field '{k}' in a {what} request", field=k)


def _prompt_or_messages(d: dict) -> tuple[str | None, list[dict] | None]:
    prompt, messages = d.get("prompt"), d.get("messages")
    if prompt is not None and messages is not None:
        raise RequestError("give 'prompt' or 'messages', not both", field="messages")
    if messages is not None:
        return None, check_messages(messages)
    if not isinstance(prompt, str) or not prompt:
        raise RequestError("'prompt' must be a non-empty string (or give 'messages')", field="prompt")
    return prompt, None


# -- the direct shapes ------------------------------------------------------------------------


def parse_generate(d: dict):
    """`{"op": "generate", "prompt" | "messages", "max_tokens", "temperature", "top_k", "top_p",
    "min_p", "seed", "stop", "chat", "enable_thinking", "ignore_eos"}` -> GenerateRequest."""
    from .engine import GenerateRequest
    from .sampling import SamplingParams

    _check_keys(d, GENERATE_KEYS, "generate")
    prompt, messages = _prompt_or_messages(d)
    sampling = SamplingParams(
        temperature=check_num(d, "temperature", 0.0, 0.0, 100.0),
        top_k=check_int(d, "top_k", 0, lo=0),
        top_p=check_num(d, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        min_p=check_num(d, "min_p", 0.0, 0.0, 1.0),
        seed=check_int(d, "seed", None, lo=0, hi=2**63 - 1),
    )
    enable_thinking = check_bool(d, "enable_thinking", None)
    return GenerateRequest(
        prompt=prompt, messages=messages,
        max_tokens=check_int(d, "max_tokens", 64, lo=1),
        sampling=sampling, stop=check_stop(d),
        chat=check_bool(d, "chat", False), enable_thinking=enable_thinking,
        ignore_eos=check_bool(d, "ignore_eos", False),
    )


def parse_system1(d: dict) -> tuple[str | None, list[str], list[dict] | None, bool]:
    """`{"op": "system1", "prompt" | "messages", "candidates": [...], "chat"}` ->
    (prompt, candidates, messages, chat), the arguments of Engine.system1."""
    _check_keys(d, SYSTEM1_KEYS, "system1")
    prompt, messages = _prompt_or_messages(d)
    cands = d.get("candidates")
    if not isinstance(cands, list) or not cands:
        raise RequestError("'candidates' must be a non-empty list of strings", field="candidates")
    for i, c in enumerate(cands):
        if not isinstance(c, str) or not c:
            raise RequestError(f"'candidates[{i}]' must be a non-empty string", field="candidates")
    return prompt, list(cands), messages, check_bool(d, "chat", False)


def run_generate(engine, req, prompt_ids: list[int] | None = None) -> dict:
    """Run a generate request to the end: {"text", "finish_reason", "record"}."""
    from .engine import Finished

    for ev in engine.generate(req, prompt_ids=prompt_ids):
        if isinstance(ev, Finished):
            return {"text": ev.text, "finish_reason": ev.finish_reason, "record": ev.record}
    raise RuntimeError("the engine ended a generation without a Finished event")
