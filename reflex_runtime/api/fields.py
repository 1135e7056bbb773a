"""Field checkers: each returns the field's value (or its default) or raises RequestError naming
the field. Shared by the direct shapes (direct_ops.py) and the OpenAI mapping (openai_mapping.py),
so the same wrong value gets the same message on every transport. Bounds come from
engine.Limits; nothing here tokenizes (text is bounded in characters first, cheaply). Text that
reaches the engine is well-formed: a lone surrogate (JSON allows "\udc80") becomes U+FFFD, as the
tokenizer would read it, so nothing downstream meets a string UTF-8 cannot encode."""

from __future__ import annotations

import math

from ..engine import Limits
from ..errors import RequestError
from ..sampling import SamplingParams
from .json_wire import well_formed

import json

ROLES = ("system", "developer", "user", "assistant", "tool")
MESSAGE_KEYS = frozenset({"role", "content", "name"})
ROLE_KEYS = {"assistant": frozenset({"tool_calls"}), "tool": frozenset({"tool_call_id"})}
# Below this a temperature is the T -> 0 limit: greedy. (1e-40 would make logits / T overflow
# float32 and pick the last token id on every backend.) vLLM draws the line at the same place.
GREEDY_BELOW = 1e-5
BRIEF_CHARS = 64
DEFAULT_LIMITS = Limits()


def brief(v) -> str:
    """A value as it may appear in a message: its repr, at most BRIEF_CHARS characters."""
    text = repr(v)
    return text if len(text) <= BRIEF_CHARS else text[: BRIEF_CHARS - 3] + "..."


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_int(d: dict, key: str, default, lo: int | None = None, hi: int | None = None):
    v = d.get(key)
    if v is None:
        return default
    if not _is_int(v) or (lo is not None and v < lo) or (hi is not None and v > hi):
        span = f" in [{lo}, {hi}]" if lo is not None and hi is not None else (f" >= {lo}" if lo is not None else "")
        raise RequestError(f"'{key}' must be an integer{span}, got {brief(v)}", field=key)
    return v


def check_num(d: dict, key: str, default, lo: float, hi: float, lo_open: bool = False) -> float:
    v = d.get(key)
    if v is None:
        return default
    if not (_is_num(v) and (v > lo if lo_open else v >= lo) and v <= hi):
        span = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise RequestError(f"'{key}' must be a number in {span}, got {brief(v)}", field=key)
    return float(v)


def check_temperature(d: dict, default: float, hi: float) -> float:
    t = check_num(d, "temperature", default, 0.0, hi)
    return 0.0 if t < GREEDY_BELOW else t


def check_sampling(d: dict, defaults: SamplingParams, max_temperature: float) -> SamplingParams:
    """temperature, top_k, top_p, min_p and seed; a field the request leaves out takes its value
    from `defaults` (the model's recommendation or reflex's, sampling_defaults.py)."""
    return SamplingParams(
        temperature=check_temperature(d, defaults.temperature, max_temperature),
        top_k=check_int(d, "top_k", defaults.top_k, lo=0),
        top_p=check_num(d, "top_p", defaults.top_p, 0.0, 1.0, lo_open=True),
        min_p=check_num(d, "min_p", defaults.min_p, 0.0, 1.0),
        seed=check_int(d, "seed", None, lo=0, hi=2**63 - 1),
    )


def check_bool(d: dict, key: str, default):
    v = d.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise RequestError(f"'{key}' must be true or false, got {brief(v)}", field=key)
    return v


def check_max_tokens(d: dict, key: str, default, limits: Limits = DEFAULT_LIMITS):
    n = check_int(d, key, default, lo=1)
    if n is not None and n > limits.max_new_tokens:
        raise RequestError(f"'{key}' {n} exceeds the limit {limits.max_new_tokens}", field=key)
    return n


def check_stop(d: dict, limits: Limits = DEFAULT_LIMITS, key: str = "stop") -> tuple[str, ...]:
    """A string or a list of non-empty strings (OpenAI accepts both)."""
    v = d.get(key)
    if v is None:
        return ()
    if isinstance(v, str):
        v = [v]
    n, chars = limits.max_stop_strings, limits.max_stop_chars
    if (not isinstance(v, list) or len(v) > n
            or not all(isinstance(s, str) and 0 < len(s) <= chars for s in v)):
        raise RequestError(f"'{key}' must be a non-empty string or a list of up to {n} non-empty strings "
                           f"of up to {chars} characters", field=key)
    return tuple(well_formed(s) for s in v)


def check_text(v, key: str, max_chars: int, what: str = "prompt") -> str:
    """A non-empty string of at most max_chars characters."""
    if not isinstance(v, str) or not v:
        raise RequestError(f"'{key}' must be a non-empty string", field=key)
    if len(v) > max_chars:
        raise RequestError(f"{what} has {len(v)} characters, the limit is {max_chars}", field=key)
    return well_formed(v)


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


def _tool_calls(v, where: str) -> tuple[list[dict], int]:
    """An assistant message's `tool_calls` (a previous response echoed back) in the form chat
    templates read: arguments as an object (OpenAI sends a JSON string). Returns them and their size."""
    if not isinstance(v, list):
        raise RequestError(f"'{where}' must be a list of tool calls", field=where)
    out, chars = [], 0
    for j, c in enumerate(v):
        at = f"{where}[{j}]"
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or c.get("type", "function") != "function" or not isinstance(f.get("name"), str):
            raise RequestError(f"'{at}' must be {{\"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}",
                               field=at)
        args = f.get("arguments", {})
        if isinstance(args, str):
            chars += len(args)
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                raise RequestError(f"'{at}.function.arguments' is not valid JSON", field=f"{at}.function.arguments") from None
        if not isinstance(args, dict):
            raise RequestError(f"'{at}.function.arguments' must be a JSON object", field=f"{at}.function.arguments")
        call = {"type": "function", "function": {"name": well_formed(f["name"]), "arguments": args}}
        if isinstance(c.get("id"), str):
            call["id"] = well_formed(c["id"])
        chars += len(f["name"])
        out.append(call)
    return out, chars


def check_messages(v, limits: Limits = DEFAULT_LIMITS, key: str = "messages") -> list[dict]:
    """A non-empty list of {role, content}; returns plain {role, content: str} dicts for the template
    (assistant messages may carry `tool_calls`, their content then optional; `tool` messages a
    `tool_call_id`). `developer` becomes `system` (chat templates know only the older name). The
    contents together are bounded like a prompt, in characters."""
    if not isinstance(v, list) or not v:
        raise RequestError(f"'{key}' must be a non-empty list of messages", field=key)
    if len(v) > limits.max_messages:
        raise RequestError(f"{len(v)} messages exceed the limit of {limits.max_messages}", field=key)
    out, chars = [], 0
    for i, m in enumerate(v):
        where = f"{key}[{i}]"
        if not isinstance(m, dict):
            raise RequestError(f"'{where}' must be an object with 'role' and 'content'", field=where)
        role = m.get("role")
        if role not in ROLES:
            raise RequestError(f"'{where}.role' must be one of {', '.join(ROLES)}, got {brief(role)}", field=f"{where}.role")
        # Clients often echo a previous response's message back, with null tool fields: allow nulls.
        allowed = MESSAGE_KEYS | ROLE_KEYS.get(role, frozenset())
        for k, val in m.items():
            if k not in allowed and val not in (None, [], {}):
                raise RequestError(f"'{where}.{k}' is not supported", field=f"{where}.{k}")
        name = m.get("name")
        if name is not None and not isinstance(name, str):
            raise RequestError(f"'{where}.name' must be a string", field=f"{where}.name")
        calls = None
        if role == "assistant" and m.get("tool_calls"):
            calls, n = _tool_calls(m["tool_calls"], f"{where}.tool_calls")
            chars += n
        if ("content" not in m or m["content"] is None) and calls is None:
            raise RequestError(f"'{where}.content' is required", field=f"{where}.content")
        text = _content_text(m["content"], where) if m.get("content") is not None else ""
        chars += len(text)
        if chars > limits.max_prompt_chars:
            raise RequestError(f"messages have more than {limits.max_prompt_chars} characters (the limit)", field=key)
        msg = {"role": "system" if role == "developer" else role, "content": well_formed(text)}
        if calls is not None:
            msg["tool_calls"] = calls
        if role == "tool" and m.get("tool_call_id") is not None:
            if not isinstance(m["tool_call_id"], str):
                raise RequestError(f"'{where}.tool_call_id' must be a string", field=f"{where}.tool_call_id")
            msg["tool_call_id"] = well_formed(m["tool_call_id"])
        out.append(msg)
    return out


def check_candidates(v, limits: Limits = DEFAULT_LIMITS, key: str = "candidates") -> list[str]:
    if not isinstance(v, list) or not v:
        raise RequestError(f"'{key}' must be a non-empty list of strings", field=key)
    if len(v) > limits.max_candidates:
        raise RequestError(f"{len(v)} candidates exceed the limit of {limits.max_candidates}", field=key)
    for i, c in enumerate(v):
        if not isinstance(c, str) or not c:
            raise RequestError(f"candidate {i} must be a non-empty string", field=key)
        if len(c) > limits.max_candidate_chars:
            raise RequestError(f"candidate {i} has {len(c)} characters, the limit is {limits.max_candidate_chars}",
                               field=key)
    return [well_formed(c) for c in v]


def check_keys(d: dict, allowed: frozenset, ignored: frozenset, what: str) -> None:
    for k in d:
        if k not in allowed and k not in ignored:
            raise RequestError(f"unknown field {brief(k)} in a {what} request", field=k[:BRIEF_CHARS])


def prompt_or_messages(d: dict, limits: Limits = DEFAULT_LIMITS) -> tuple[str | None, list[dict] | None]:
    prompt, messages = d.get("prompt"), d.get("messages")
    if prompt is not None and messages is not None:
        raise RequestError("give 'prompt' or 'messages', not both", field="messages")
    if messages is not None:
        return None, check_messages(messages, limits)
    if not isinstance(prompt, str) or not prompt:
        raise RequestError("'prompt' must be a non-empty string (or give 'messages')", field="prompt")
    return check_text(prompt, "prompt", limits.max_prompt_chars), None
