"""One input, every front end, one answer: the same status, kind, message, field and code, and
the same auth outcome, from `serve` (real HTTP), the stdio/uds line loop, and the Lambda handler
(HTTP events and direct invokes). All of them sit on reflex_runtime/api; this proves it.

A request body goes to serve and the handler as `POST /v1/system1`, and to the line loop and the
handler's direct invoke as `{"op": "system1", ...body}` (raw bytes that are not a JSON object
cannot be a direct invoke: Lambda parses the event itself). The API key travels as the
Authorization header over HTTP and as the `"authorization"` field of a direct request.
"""

from __future__ import annotations

import json

import pytest

from reflex_runtime.frontends import serve
from reflex_runtime.engine import Limits

from front_ends import KEY, HandlerFront, LinesFront, ServeFront

GOOD = {"prompt": "q", "candidates": ["Hello", "Bye"]}
LIMITS = Limits(max_new_tokens=256)


@pytest.fixture(scope="module")
def fronts():
    mp = pytest.MonkeyPatch()
    mp.setattr(serve, "_log", lambda msg: None)  # access lines arrive after the test moved on
    serve_front, handler = ServeFront(), HandlerFront(mp)
    yield {"serve": serve_front, "lines": LinesFront(), "handler": handler}
    serve_front.close()
    handler.close()
    mp.undo()


def _everywhere(fronts, raw: bytes, obj: dict | None, credential: str | None = "Bearer " + KEY) -> dict:
    """Outcomes of one system1 request on every front end that can carry it."""
    out = {"serve": fronts["serve"].http("POST", "/v1/system1", raw, credential),
           "handler_http": fronts["handler"].http("POST", "/v1/system1", raw, credential)}
    if obj is not None:
        out["lines"] = fronts["lines"].direct({"op": "system1", **obj}, credential)
        out["handler_direct"] = fronts["handler"].direct({"op": "system1", **obj}, credential)
    else:
        out["lines"] = fronts["lines"].line(raw)  # no op, no key: the line must fail at parsing first
    return out


def _assert_same(outcomes: dict) -> None:
    seen = {name: o.same() for name, o in outcomes.items()}
    assert len(set(seen.values())) == 1, json.dumps(seen, indent=1, default=str)


NESTED = b"[" * 100_000 + b"]" * 100_000
BIG_INT = b'{"prompt": "q", "candidates": ["a"], "seed": ' + b"7" * 5000 + b"}"

BAD_BODIES = [
    # (name, raw bytes or an object, status, field, message start)
    ("not json", b"{nope", 400, None, "invalid JSON body: Expecting property name enclosed in double quotes"),
    ("nan", b'{"prompt": NaN, "candidates": ["a"]}', 400, None, "invalid JSON body: NaN is not allowed"),
    ("not an object", b"[1, 2]", 400, None, "a request must be a JSON object"),
    ("not utf-8", b'{"prompt": "\xff", "candidates": ["a"]}', 400, None, "invalid JSON body: not UTF-8"),
    ("nested 100,000 deep", NESTED, 400, None, "invalid JSON body: nested too deeply"),
    ("a 5,000-digit integer", BIG_INT, 400, None, "invalid JSON body: a number of 5000 characters"),
    ("candidates not a list", {"prompt": "q", "candidates": "Paris"}, 400, "candidates", "'candidates' must be a non-empty list"),
    ("candidate not a string", {"prompt": "q", "candidates": ["a", 3]}, 400, "candidates", "candidate 1 must be"),
    ("too many candidates", {"prompt": "q", "candidates": ["a"] * 65}, 400, "candidates", "65 candidates exceed"),
    ("prompt not a string", {"prompt": 5, "candidates": ["a"]}, 400, "prompt", "'prompt' must be a non-empty string"),
    ("prompt and messages", {"prompt": "q", "messages": [{"role": "user", "content": "x"}], "candidates": ["a"]},
     400, "messages", "give 'prompt' or 'messages'"),
    ("bad role", {"messages": [{"role": "robot", "content": "x"}], "candidates": ["a"]}, 400, "messages[0].role",
     "'messages[0].role' must be one of"),
    ("chat not a bool", {"prompt": "q", "candidates": ["a"], "chat": "yes"}, 400, "chat", "'chat' must be true or false"),
    ("unknown field", {"prompt": "q", "candidates": ["a"], "colour": 1}, 400, "colour", "unknown field 'colour'"),
    ("a lone surrogate as a field name", {"prompt": "q", "candidates": ["a"], "\udc80": 1}, 400, "\\udc80",
     "unknown field '\\udc80'"),
    ("a prompt too long to tokenize", {"prompt": "x" * (LIMITS.max_prompt_chars + 1), "candidates": ["a"]}, 400,
     "prompt", f"prompt has {LIMITS.max_prompt_chars + 1} characters, the limit is {LIMITS.max_prompt_chars}"),
]


@pytest.mark.parametrize("name, body, status, field, start", BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_bad_bodies_get_one_answer_everywhere(fronts, name, body, status, field, start):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    outcomes = _everywhere(fronts, raw, None if isinstance(body, bytes) else body)
    _assert_same(outcomes)
    o = outcomes["serve"]
    assert (o.status, o.kind, o.field) == (status, "invalid_request_error", field)
    assert o.message.startswith(start) and "\n" not in o.message, o.message
    o.message.encode("utf-8")  # encodable on every transport


CREDENTIALS = [
    ("Bearer " + KEY, True),
    ("bearer " + KEY, True),
    ("BEARER \t " + KEY + " \t", True),
    ("Bearer\t" + KEY, True),
    ("  Bearer  " + KEY, True),
    (None, False),
    ("", False),
    ("Bearer", False),
    ("Bearer ", False),
    (KEY, False),
    ("Bearer" + KEY, False),
    ("Basic " + KEY, False),
    ("Bearer wrong", False),
    ("Bearer " + KEY.upper(), False),  # the key itself is case-sensitive
    ("Bearer " + KEY + " extra", False),
    ("Bearer " + KEY + "x", False),
]


@pytest.mark.parametrize("credential, accepted", CREDENTIALS, ids=[repr(c) for c, _ in CREDENTIALS])
def test_every_credential_spelling_gets_one_outcome_everywhere(fronts, credential, accepted):
    outcomes = _everywhere(fronts, json.dumps(GOOD).encode(), GOOD, credential)
    _assert_same(outcomes)
    o = outcomes["serve"]
    if accepted:
        assert o.status == 200
        texts = {n: (x.body or {}).get("best_text") for n, x in outcomes.items()}
        assert set(texts.values()) == {"Hello"}, texts
    else:
        assert (o.status, o.kind, o.code) == (401, "invalid_request_error", "invalid_api_key")
        assert o.message == "missing or invalid API key (send 'Authorization: Bearer <key>')"
        assert o.headers["WWW-Authenticate"] == "Bearer"


def test_bad_json_with_a_bad_key_is_refused_before_parsing_over_http(fronts):
    """HTTP reads the key from a header, so it is checked before the body; a JSON line carries
    its key inside itself, so a line that is not JSON can only be refused as such."""
    for front in ("serve", "handler"):
        assert fronts[front].http("POST", "/v1/system1", b"{nope", "Bearer wrong").status == 401


@pytest.mark.parametrize("method, path, status, code", [
    ("POST", "/v1/nope", 404, "not_found"),
    ("GET", "/", 404, "not_found"),
    ("GET", "/v1/chat/completions", 405, "method_not_allowed"),
    ("POST", "/v1/models", 405, "method_not_allowed"),
])
def test_unknown_routes_get_one_answer_on_both_http_front_ends(fronts, method, path, status, code):
    raw = b"{}" if method == "POST" else None
    a = fronts["serve"].http(method, path, raw, "Bearer " + KEY)
    b = fronts["handler"].http(method, path, raw, "Bearer " + KEY)
    assert a.same() == b.same() and (a.status, a.code) == (status, code)
    if status == 405:
        assert a.headers["Allow"] == b.headers["Allow"]
    # unknown routes need no key: the answer is the same without one
    assert fronts["serve"].http(method, path, raw, None).same() == a.same()


@pytest.mark.parametrize("op", ["nope", None, 5, ["generate"]])
def test_unknown_ops_get_one_answer_on_every_direct_front_end(fronts, op):
    a = fronts["lines"].direct({"op": op, "prompt": "q"}, "Bearer " + KEY)
    b = fronts["handler"].direct({"op": op, "prompt": "q"}, "Bearer " + KEY)
    assert a.same() == b.same()
    assert (a.status, a.kind, a.field) == (400, "invalid_request_error", "op")
    assert a.message.startswith("unknown op ")


def test_health_needs_no_key_anywhere(fronts):
    assert fronts["serve"].http("GET", "/healthz", None, None).status == 200
    assert fronts["handler"].http("GET", "/healthz", None, None).status == 200
    for front in ("lines", "handler"):
        o = fronts[front].direct({"op": "ping"}, None)
        assert o.status == 200 and o.body["ok"] is True


def test_generate_fields_match_between_completions_and_the_direct_op(fronts):
    """Fields the OpenAI completion and the direct generate share are checked by the same code."""
    for patch in ({"max_tokens": "many"}, {"max_tokens": 0}, {"max_tokens": 100_000}, {"stop": ["a"] * 9},
                  {"seed": -1}, {"top_p": 0}, {"top_k": 1.5}):
        body = {"prompt": "hi", **patch}
        a = fronts["serve"].http("POST", "/v1/completions", json.dumps(body).encode(), "Bearer " + KEY)
        b = fronts["lines"].direct({"op": "generate", **body}, "Bearer " + KEY)
        c = fronts["handler"].direct({"op": "generate", **body}, "Bearer " + KEY)
        assert a.same() == b.same() == c.same(), (patch, a, b, c)
        assert a.status == 400 and a.field == next(iter(patch))
