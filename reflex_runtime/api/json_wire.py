"""JSON in and out of every transport.

In: `parse_object(raw)` turns a request body or line into a dict, or raises a RequestError whose
message says what is wrong. Refused: bytes that are not UTF-8, NaN/Infinity (no field can use
them), numbers spelled with more than MAX_NUMBER_CHARS characters (a 5,000-digit integer would
otherwise meet Python's int-size guard as a ValueError), nesting deeper than the decoder's
recursion guard (100,000 brackets would otherwise end in RecursionError), and an object nesting
deeper than MAX_DEPTH, found by a scan of the text before decoding (the decoder would accept up to
~1,000 levels, how many depending on the caller's own stack, enough for a RecursionError in any
later code that recurses over a value: repr, json.dumps, templates). Lambda hands the handler its
direct events already parsed: `check_depth` walks those, with the same answer (direct_ops.answer_event).

Out: `dumps(obj)` always gives UTF-8 bytes. A request may carry lone surrogates (JSON allows
"\\udc80" escapes; they decode to code points UTF-8 cannot hold) and a response may echo them
(a candidate's text): those become U+FFFD instead of an exception after the headers went out.
"""

from __future__ import annotations

import json
import re

from ..errors import RequestError

MAX_BODY_BYTES = 4 * 1024 * 1024  # one request: an HTTP body, a JSON line, a Lambda event body
MAX_NUMBER_CHARS = 64  # seeds and token ids need 20; floats such as 0.30000000000000004 need 19
# JSON levels in one request (the request object is level 1). A schema may nest 64 levels
# (engine.Limits.max_schema_depth) and sits 4-5 levels down (tools[i].function.parameters).
MAX_DEPTH = 100
MAX_KEY_CHARS = 64  # of one key, in a field name
MAX_FIELD_CHARS = 200  # of a whole field name (bounded nesting still allows long paths)


def _no_constant(name: str):
    raise RequestError(f"invalid JSON body: {name} is not allowed")


def _number(kind):
    def parse(text: str):
        if len(text) > MAX_NUMBER_CHARS:
            raise RequestError(f"invalid JSON body: a number of {len(text)} characters (the limit is {MAX_NUMBER_CHARS})")
        return kind(text)

    return parse


_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_int=_number(int), parse_float=_number(float))


def parse_object(raw: bytes | str) -> dict:
    """One request as a JSON object."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else raw
        if text.lstrip(" \t\r\n")[:1] == "{" and text.count("{") + text.count("[") > MAX_DEPTH \
                and _deeper_than(text, MAX_DEPTH):
            _scan_depth(text, MAX_DEPTH)
        body = _DECODER.decode(text)
    except UnicodeDecodeError:
        raise RequestError("invalid JSON body: not UTF-8") from None
    except json.JSONDecodeError as e:
        raise RequestError(f"invalid JSON body: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise RequestError("invalid JSON body: nested too deeply") from None
    if not isinstance(body, dict):
        raise RequestError("a request must be a JSON object")
    return body


_STRING = r'"[^"\\]*(?:\\.[^"\\]*)*"'
_STRINGS = re.compile(_STRING)
_TOKENS = re.compile(_STRING + r'|[\[\]{},:]')  # strings and structure; values skipped


def _deeper_than(text: str, limit: int) -> bool:
    """Whether the text's brackets (outside strings) nest deeper than `limit`: vectorized, ~20x
    faster than _scan_depth, which then names the field only for a text that is too deep."""
    import numpy as np  # loaded with the engine already; only bracket-heavy bodies get here

    b = np.frombuffer(_STRINGS.sub("", text).encode("utf-8", "surrogatepass"), dtype=np.uint8)
    step = (b == 0x5B).astype(np.int32) + (b == 0x7B) - (b == 0x5D) - (b == 0x7D)
    return step.size > 0 and int(np.cumsum(step).max()) > limit


def _scan_depth(text: str, limit: int) -> None:
    """The depth error for an object text nesting deeper than `limit`, found without decoding or
    recursion; text that is not valid JSON is left for the decoder to describe."""
    path: list = []  # per open container: the key or index of the value being read in it
    key = None
    for m in _TOKENS.finditer(text):
        t = m.group()
        if t[0] == '"':
            key = t
        elif t in "[{":
            if len(path) >= limit:
                raise _too_deep(path, limit)
            path.append(0 if t == "[" else None)
        elif t in "]}":
            if not path:
                return
            path.pop()
        elif path and t == ":" and key is not None:
            try:
                path[-1] = json.loads(key)
            except ValueError:
                path[-1] = key[1:-1]
        elif path and t == "," and isinstance(path[-1], int):
            path[-1] += 1


def _too_deep(path, limit: int) -> RequestError:
    top = field_path("", path[:1])[1:]
    return RequestError(f"'{top}' is nested more than {limit} levels deep", field=field_path(top, path[1:]))


def field_path(base: str, path) -> str:
    """`base`, then `.key` or `[index]` per step of `path`: how request fields are named."""
    out = base
    for k in path:
        if isinstance(k, int):
            out += f"[{k}]"
        else:
            k = str(k)
            out += "." + (k if len(k) <= MAX_KEY_CHARS else k[:MAX_KEY_CHARS - 3] + "...")
    return out if len(out) <= MAX_FIELD_CHARS else out[:80] + "..." + out[-(MAX_FIELD_CHARS - 83):]


def check_depth(obj: dict, limit: int = MAX_DEPTH) -> None:
    """RequestError naming the field when `obj` nests more than `limit` levels (iteratively)."""
    stack = [(obj, (), 1)]
    while stack:
        node, path, depth = stack.pop()
        for k, v in node.items() if isinstance(node, dict) else enumerate(node):
            if isinstance(v, (dict, list)):
                if depth >= limit:
                    raise _too_deep(path + (k,), limit)
                stack.append((v, path + (k,), depth + 1))


_SURROGATE = re.compile("[\ud800-\udfff]")  # no UTF-8 for these; json.loads already joined escaped pairs


def well_formed(text: str) -> str:
    """`text` with each lone surrogate replaced by U+FFFD (what the tokenizer reads it as)."""
    return text if text.isascii() else _SURROGATE.sub("\ufffd", text)


def _scrub(obj):
    if isinstance(obj, str):
        return well_formed(obj)
    if isinstance(obj, dict):
        return {_scrub(k): _scrub(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_scrub(v) for v in obj]
    return obj


_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))  # json.dumps builds one per call


def dumps(obj) -> bytes:
    """Compact UTF-8 JSON that always encodes (see the module docstring)."""
    text = _COMPACT.encode(obj)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # rare: scrub once, only then
        return _COMPACT.encode(_scrub(obj)).encode("utf-8")
