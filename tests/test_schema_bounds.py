"""Hostile JSON schemas (issue 30, items 1-3) get one 400 on every front end, and the guard under
the bounds holds on its own.

The same request goes to `serve` (real HTTP) and the handler's Function URL event as a chat
completion, and to the stdio/uds line loop and the handler's direct invoke as a `generate` op
(tests/front_ends.py). The engines are fakes whose runner follows grammars (fake_engine.GrammarRunner),
so a schema that passes validation really runs through llguidance. Before the fix, the $ref chain
killed the process (SIGSEGV in llguidance's compile), the unsatisfiable schemas got a 200 with
invalid JSON, and the deep ones a 500 (RecursionError)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from reflex_runtime.text import native_guard
from reflex_runtime.frontends import serve
from reflex_runtime.api.schema_bounds import check_schema
from reflex_runtime.engine import Limits
from reflex_runtime.errors import RequestError

from fake_engine import make_engine
from front_ends import KEY, HandlerFront, LinesFront, ServeFront

AUTH = "Bearer " + KEY
LIMITS = Limits()
RF = "response_format.json_schema.schema"
ASK = [{"role": "user", "content": "Give me JSON."}]


def ref_chain(n: int) -> dict:
    """{"$defs": {"d0": {"$ref": "#/$defs/d1"}, ..., "dN": {"type": "integer"}}, "$ref": "#/$defs/d0"}"""
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def nested(n: int, inner=None) -> dict:
    s = inner or {"type": "integer"}
    for _ in range(n):
        s = {"type": "array", "items": s}
    return s


def rf(schema, **extra) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, **extra}}


def tool(params, **extra) -> list[dict]:
    return [{"type": "function", "function": {"name": "f", "parameters": params, **extra}}]


@pytest.fixture(scope="module")
def fronts():
    mp = pytest.MonkeyPatch()
    mp.setattr(serve, "_log", lambda msg: None)

    def engine():
        e = make_engine(grammar=True)
        e.tools_format = "hermes"
        return e

    f = {"serve": ServeFront(engine()), "lines": LinesFront(engine()), "handler": HandlerFront(mp, engine())}
    yield f
    f["serve"].close()
    f["handler"].close()
    mp.undo()


def deep_dumps(obj) -> str:
    """json.dumps without recursion: the test's own encoder must not stop a 990-level body."""
    out, todo = [], [obj]
    while todo:
        x = todo.pop()
        if isinstance(x, _Raw):
            out.append(x)
        elif isinstance(x, dict):
            todo.append(_Raw("}"))
            for j, (k, v) in enumerate(reversed(list(x.items()))):
                todo += [v, _Raw(json.dumps(k) + ":")] + ([_Raw(",")] if j < len(x) - 1 else [])
            todo.append(_Raw("{"))
        elif isinstance(x, list):
            todo.append(_Raw("]"))
            for j, v in enumerate(reversed(x)):
                todo += [v] + ([_Raw(",")] if j < len(x) - 1 else [])
            todo.append(_Raw("["))
        else:
            out.append(json.dumps(x))
    return "".join(out)


class _Raw(str):
    pass


def everywhere(f, fields: dict) -> dict:
    body = {"messages": ASK, "max_tokens": 64, **fields}
    raw = deep_dumps(body).encode()
    line = deep_dumps({"op": "generate", "authorization": AUTH, **body}).encode()
    return {"serve": f["serve"].http("POST", "/v1/chat/completions", raw, AUTH),
            "handler_http": f["handler"].http("POST", "/v1/chat/completions", raw, AUTH),
            "lines": f["lines"].line(line),
            "handler_direct": f["handler"].direct({"op": "generate", **body}, AUTH)}


def one_answer(outs: dict):
    seen = {name: o.same() for name, o in outs.items()}
    assert len(set(seen.values())) == 1, json.dumps(seen, indent=1, default=str)
    o = outs["serve"]
    assert "\n" not in (o.message or "") and len(o.message or "") < 600, o.message
    return o


CASES = [
    # name, request fields, field, message start
    ("ref chain 2,500 (killed serve/stdio)", {"response_format": rf(ref_chain(2500))}, f"{RF}.$defs.d63",
     f"'{RF}' has a chain of 2501 $ref hops, the limit is 64"),
    ("ref chain 3,000 (killed the handler)", {"response_format": rf(ref_chain(3000))}, f"{RF}.$defs.d63",
     f"'{RF}' has a chain of 3001 $ref hops"),
    ("ref chain in tool parameters (within the tools' 65,536 characters)",
     {"tools": tool(ref_chain(1500)), "tool_choice": "required"},
     "tools[0].function.parameters.$defs.d63", "'tools[0].function.parameters' has a chain of 1501 $ref hops"),
    ("self reference", {"response_format": rf({"$ref": "#"})}, RF, f"no finite JSON value satisfies '{RF}'"),
    ("mutual references", {"response_format": rf({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                                                  "$ref": "#/$defs/a"})}, RF, "no finite JSON value satisfies"),
    ("infinitely required recursion", {"response_format": rf({"type": "object", "properties": {"a": {"$ref": "#"}},
                                                              "required": ["a"]})}, RF, "no finite JSON value satisfies"),
    ("1,000 optional properties (the engine gives up after '{')",
     {"response_format": rf({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(1000)}})},
     RF, f"'{RF}' could not be followed to the end of a valid output: Parser Error: Current row has"),
    ("strict 'yes'", {"response_format": rf({"type": "object"}, strict="yes")}, "response_format.json_schema.strict",
     "'response_format.json_schema.strict' must be true or false"),
    ("tool strict 'yes'", {"tools": tool({"type": "object"}, strict="yes")}, "tools[0].function.strict",
     "'tools[0].function.strict' must be true or false"),
    ("tool parameters nested 975 deep (a 500 on serve)", {"tools": tool(nested(975))},
     "tools[0].function.parameters" + ".items" * 95, "'tools' is nested more than 100 levels deep"),
    ("array items nested 990 deep (a 500 in a direct event)", {"response_format": rf(nested(990))},
     "response_format.json_schema.schema" + ".items" * 96, "'response_format' is nested more than 100 levels deep"),
    ("schema nested 70 deep", {"response_format": rf(nested(70))}, RF + ".items" * 64,
     f"'{RF}' is nested more than 64 levels deep"),
    ("10,001 objects", {"response_format": rf({"type": "object", "properties": {
        f"p{i}": {"type": "integer"} for i in range(10_001)}})}, f"{RF}.properties.p9998",
     f"'{RF}' has more than 10000 objects and arrays"),
]


@pytest.mark.parametrize("name, fields, field, start", CASES, ids=[c[0] for c in CASES])
def test_hostile_schemas_get_one_400_everywhere(fronts, name, fields, field, start):
    o = one_answer(everywhere(fronts, fields))
    assert (o.status, o.kind) == (400, "invalid_request_error"), o
    assert o.message.startswith(start), o.message
    # the field past the bound, as long names are shortened (json_wire.field_path)
    assert o.field == field or (len(field) > 200 and o.field.startswith(field[:80]) and o.field.endswith(field[-117:])), \
        o.field


def test_a_schema_within_the_bounds_still_gives_valid_json_everywhere(fronts):
    schema = {"type": "object", "additionalProperties": False, "required": ["n", "ok", "kind", "tree"],
              "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}, "kind": {"enum": ["a", "b"]},
                             "tree": {"$ref": "#/$defs/node"}},
              "$defs": {"node": {"type": "object", "required": ["kids"], "additionalProperties": False,
                                 "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}}
    outs = everywhere(fronts, {"response_format": rf(schema)})
    texts = set()
    for name, o in outs.items():
        assert o.status == 200, (name, o)
        texts.add(o.body["choices"][0]["message"]["content"] if "choices" in o.body else o.body["text"])
    (text,) = texts
    assert json.loads(text) == {"n": 0, "ok": False, "kind": "a", "tree": {"kids": []}}, text


def test_a_grammar_failure_mid_stream_is_an_error_event_not_a_clean_end(fronts):
    body = {"messages": ASK, "max_tokens": 64, "stream": True,
            "response_format": rf({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(1000)}})}
    import http.client

    c = http.client.HTTPConnection("127.0.0.1", fronts["serve"].port, timeout=30)
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Authorization": AUTH})
    r = c.getresponse()
    events = [ln[6:] for ln in r.read().decode().split("\n\n") if ln.startswith("data: ")]
    c.close()
    assert r.status == 200 and events[-1] != "[DONE]", events  # headers went out with the first token
    err = json.loads(events[-1])["error"]
    assert err["param"] == RF and "could not be followed" in err["message"]


def test_the_bounds_take_milliseconds_on_a_body_sized_schema():
    import time

    for n, refused in ((4900, False), (9000, True)):  # ~9,800 and ~18,000 objects and arrays, 4-8 MB
        big = {"type": "object", "properties": {f"p{i}": {"enum": ["x" * 40] * 20} for i in range(n)}}
        assert len(json.dumps(big)) > 4_000_000
        t0 = time.process_time()
        try:
            check_schema(big, RF, LIMITS)
        except RequestError as e:
            assert refused and "objects and arrays" in str(e)
        else:
            assert not refused
        assert time.process_time() - t0 < 1.0


# -- the guard under the bounds: a large stack ----------------------------------------------


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRELUDE = "import sys; sys.path.insert(0, 'tests'); from test_schema_bounds import ref_chain, deepest_within_bounds\n"


def _run(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code), *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)


def test_the_guarded_compile_survives_a_chain_the_bounds_would_refuse():
    """Straight to grammar.Grammar.check (no bounds): a 20,000-hop chain needs ~70 MB of stack.
    On the caller's own thread (8 MB) the same call kills the process; guarded it answers."""
    guarded = _run("""
        from reflex_runtime.text.grammar import Grammar
        Grammar.json_schema(ref_chain(20000), "s").check()
        print("answered")
    """)
    assert guarded.returncode == 0 and "answered" in guarded.stdout, guarded.stderr[-2000:]
    bare = _run("""
        import json, llguidance
        g = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(ref_chain(20000)))
        llguidance.LLMatcher.validate_grammar(g)
        print("answered")
    """)
    assert bare.returncode in (-11, 139) and "answered" not in bare.stdout, (bare.returncode, bare.stderr[-500:])


WRAPS = {
    "items": lambda s: {"type": "array", "items": s},
    "properties": lambda s: {"type": "object", "properties": {"a": s}, "required": ["a"]},
    "anyOf": lambda s: {"anyOf": [s, {"type": "null"}]},
    "allOf": lambda s: {"allOf": [s, {"type": "object"}]},
    "additionalProperties": lambda s: {"type": "object", "additionalProperties": s},
    "prefixItems": lambda s: {"type": "array", "prefixItems": [s], "minItems": 1},
}


def deepest_within_bounds(kind: str) -> dict:
    """A chain of max_ref_chain definitions, each nested as deep as the bounds accept: the
    deepest recursion a schema that passes the bounds can ask of the compiler."""
    def build(per):
        defs = {}
        for i in range(LIMITS.max_ref_chain):
            s = {"$ref": f"#/$defs/d{i + 1}"} if i + 1 < LIMITS.max_ref_chain else {"type": "object"}
            for _ in range(per):
                s = WRAPS[kind](s)
            defs[f"d{i}"] = s
        return {"$defs": defs, "$ref": "#/$defs/d0"}

    per = 1
    while True:
        try:
            check_schema(build(per + 1), RF, LIMITS)
        except Exception:  # noqa: BLE001 - the first nesting the bounds refuse
            return build(per)
        per += 1


def test_the_bounded_worst_case_needs_an_eighth_of_the_guard_stack():
    """Each worst shape compiles on a thread with STACK_BYTES / 8: the guard has 8x what the
    bounds let through (on this machine; 16 MB was too little for the `items` shape)."""
    code = f"""
        import json, threading, llguidance
        kind = sys.argv[1]
        g = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(deepest_within_bounds(kind)))
        out = []
        threading.stack_size({native_guard.STACK_BYTES // 8})
        t = threading.Thread(target=lambda: out.append(llguidance.LLMatcher.validate_grammar(g)))
        t.start(); t.join()
        print("compiled", kind, repr(out[0][:60]))
    """
    for kind in WRAPS:
        r = _run(code, kind)
        assert r.returncode == 0 and f"compiled {kind} ''" in r.stdout, (kind, r.returncode, r.stdout, r.stderr[-500:])


def test_a_forced_tool_call_keeps_its_parameters_own_defs(fronts):
    """The call's schema embeds the parameters under "arguments": their local refs are rebased
    (tools.rebase_refs). Before, any `#/$defs/...` in forced parameters was a 400 (found by the
    schema fuzz: "Pointer '/$defs/d0' does not exist")."""
    params = {"type": "object", "required": ["where"], "additionalProperties": False,
              "properties": {"where": {"$ref": "#/$defs/place"}},
              "$defs": {"place": {"enum": ["home", "work"]}}}
    outs = everywhere(fronts, {"tools": tool(params), "tool_choice": "required", "max_tokens": 100})
    for name, o in outs.items():
        assert o.status == 200, (name, o)
        calls = o.body["choices"][0]["message"]["tool_calls"] if "choices" in o.body else o.body["tool_calls"]
        assert json.loads(calls[0]["function"]["arguments"]) == {"where": "home"}, (name, calls)
