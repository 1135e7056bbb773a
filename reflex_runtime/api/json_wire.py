"""JSON in and out of every transport.

In: `parse_object(raw)` turns a request body or line into a dict, or raises a RequestError whose
message says what is wrong. Refused: bytes that are not UTF-8, NaN/Infinity (no field can use
them), numbers spelled with more than MAX_NUMBER_CHARS characters (a 5,000-digit integer would
otherwise meet Python's int-size guard as a ValueError), and nesting deeper than the decoder's
recursion guard (100,000 brackets would otherwise end in RecursionError).

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


def dumps(obj) -> bytes:
    """Compact UTF-8 JSON that always encodes (see the module docstring)."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # rare: scrub once, only then
        return json.dumps(_scrub(obj), ensure_ascii=False, separators=(",", ":")).encode("utf-8")
