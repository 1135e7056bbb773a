"""Schema fuzz (issue 30): random nesting, $ref graphs (chains, cycles, self references), invalid
keywords, and sizes up to the body limit, as `response_format` or as the parameters of a forced
tool call. No case may kill or hang the process, or answer anything but a 200 or a one-line 4xx.

In-process, FUZZ_CASES cases (env REFLEX_SCHEMA_FUZZ_CASES, default 2,000) go through the path
`serve` runs: openai_mapping.call -> validation (api/schema_bounds.py, then llguidance's compile
through native_guard) -> prepare -> run (the engine builds the matcher, guarded too, and a
grammar-following fake runner decodes up to 8 tokens). A subset then goes through real `reflex
serve` and `reflex stdio` processes (the CPU backend, SmolLM2), which must answer each and live.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time

import pytest

from reflex_runtime.api import openai_mapping
from reflex_runtime.api.json_wire import MAX_BODY_BYTES
from reflex_runtime.errors import ReflexError

from fake_engine import make_engine
from front_ends import serve_process
from test_schema_bounds import deep_dumps, nested, ref_chain

FUZZ_CASES = int(os.environ.get("REFLEX_SCHEMA_FUZZ_CASES", "2000"))
SEED = 30
CASE_CPU_S = 10.0  # one case, validation to the last token (grammar.COMPILE_TIMEOUT_S is the same)
ASK = [{"role": "user", "content": "JSON please."}]

LEAVES = [
    {"type": "string"}, {"type": "string", "maxLength": 3}, {"type": "string", "pattern": "^[a-c]{1,3}$"},
    {"type": "integer", "minimum": 0, "maximum": 9}, {"type": "number"}, {"type": "boolean"}, {"type": "null"},
    {"enum": ["a", "b", 1, None]}, {"const": "k"}, {"type": "string", "format": "date"}, True, {},
    {"type": ["string", "null"]}, {"type": "array", "maxItems": 0},
]
BAD = [
    {"type": "nope"}, {"type": "string", "pattern": "("}, {"type": "object", "required": "a"}, {"$ref": "#/nope"},
    {"$ref": "http://example.com/s.json"}, {"type": "array", "minItems": -1}, {"type": "integer", "minimum": 5,
    "maximum": 1}, False, {"oneOf": []}, {"anyOf": "x"}, {"properties": []}, {"$ref": 5}, {"type": "string",
    "minLength": 4, "maxLength": 2}, {"allOf": [{"type": "string"}, {"type": "integer"}]}, {"not": {}},
]


def _leaf(rng: random.Random, names: list[str]):
    r = rng.random()
    if r < 0.1:
        return rng.choice(BAD)
    if r < 0.3 and names:
        return {"$ref": rng.choice(["#"] + [f"#/$defs/{n}" for n in names])}
    return rng.choice(LEAVES)


def _tree(rng: random.Random, depth: int, names: list[str], budget: list[int]):
    """A random schema at most `depth` levels deep, drawing on `budget` (nodes left)."""
    budget[0] -= 1
    if depth <= 0 or budget[0] <= 0 or rng.random() < 0.25:
        return _leaf(rng, names)
    kind = rng.choice(["object", "object", "array", "anyOf", "allOf", "oneOf", "ref"])
    if kind == "object":
        props = {f"k{j}": _tree(rng, depth - 1, names, budget) for j in range(rng.randint(0, 5))}
        s = {"type": "object", "properties": props}
        if props and rng.random() < 0.6:
            s["required"] = rng.sample(sorted(props), rng.randint(1, len(props)))
        if rng.random() < 0.4:
            s["additionalProperties"] = rng.choice([False, True, _leaf(rng, names)])
        return s
    if kind == "array":
        s = {"type": "array", "items": _tree(rng, depth - 1, names, budget)}
        if rng.random() < 0.4:
            s["minItems"] = rng.randint(0, 3)
        if rng.random() < 0.2:
            s["prefixItems"] = [_tree(rng, depth - 1, names, budget) for _ in range(rng.randint(1, 3))]
        return s
    if kind == "ref":
        return _leaf(rng, names) if not names else {"$ref": f"#/$defs/{rng.choice(names)}"}
    return {kind: [_tree(rng, depth - 1, names, budget) for _ in range(rng.randint(1, 3))]}


def random_schema(rng: random.Random):
    """One case: (family, schema)."""
    family = rng.choices(["tree", "graph", "deep", "size", "crasher"], weights=[45, 33, 15, 3, 4])[0]
    if family == "tree":
        names = [f"d{i}" for i in range(rng.randint(0, 4))]
        s = _tree(rng, rng.randint(1, 12), names, [rng.randint(5, 300)])
        if names and isinstance(s, dict):
            s = {**s, "$defs": {n: _tree(rng, 4, names, [30]) for n in names}}
        return family, s
    if family == "graph":  # $ref graphs: chains, cycles, DAGs over many definitions
        n = rng.choice([2, 3, 10, 40, 63, 64, 65, 200, 1000])
        names = [f"d{i}" for i in range(n)]
        defs = {}
        for i, name in enumerate(names):
            r = rng.random()
            nxt = names[(i + 1) % n] if rng.random() < 0.7 else rng.choice(names)
            if r < 0.4:
                defs[name] = {"$ref": f"#/$defs/{nxt}"} if i + 1 < n or rng.random() < 0.5 else {"type": "integer"}
            elif r < 0.7:
                defs[name] = {"type": "object", "properties": {"a": {"$ref": f"#/$defs/{nxt}"}, "b": _leaf(rng, [])},
                              "required": rng.choice([["a"], ["b"], []])}
            else:
                defs[name] = {"anyOf": [{"$ref": f"#/$defs/{nxt}"}, _leaf(rng, [])]}
        return family, {"$defs": defs, "$ref": f"#/$defs/{names[0]}"}
    if family == "deep":  # around the depth bounds (64 in a schema, 100 in a request)
        inner = _tree(rng, 3, [], [10])
        return family, rng.choice([nested, _nested_objects, _nested_any])(rng.choice([30, 60, 63, 64, 65, 96, 97, 150]),
                                                                           inner)
    if family == "size":  # up to the body limit
        target = rng.choice([10_000, 200_000, 1_000_000, MAX_BODY_BYTES - 4096])
        width = rng.choice([8, 40, 400])
        shape = rng.choice(["enum", "properties", "anyOf", "const", "pattern"])
        count = max(1, target // (width + 24))
        word = lambda j: f"{j:x}".rjust(width, "x")  # noqa: E731
        if shape == "enum":
            return family, {"enum": [word(j) for j in range(count)]}
        if shape == "properties":
            return family, {"type": "object", "properties": {word(j): {"type": "integer"} for j in range(count)},
                            "required": [word(0)]}
        if shape == "anyOf":
            return family, {"anyOf": [{"const": word(j)} for j in range(min(count, 9000))]}
        if shape == "const":
            return family, {"const": "y" * (target - 100)}
        return family, {"type": "string", "pattern": "^(" + "|".join(word(j) for j in range(count // 2)) + ")$"}
    return family, rng.choice([lambda: ref_chain(rng.choice([2500, 3000, 20000])), lambda: nested(975),
                               lambda: nested(990), lambda: {"$ref": "#"},
                               lambda: {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}])()


def _nested_objects(n: int, inner) -> dict:
    for _ in range(n):
        inner = {"type": "object", "properties": {"a": inner}, "required": ["a"]}
    return inner


def _nested_any(n: int, inner) -> dict:
    for _ in range(n):
        inner = {"anyOf": [inner, {"type": "null"}]}
    return inner


def make_body(rng: random.Random, schema) -> dict:
    body = {"messages": ASK, "max_tokens": 8}
    if rng.random() < 0.7 or not isinstance(schema, dict):
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "f", "schema": schema}}
    else:
        body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
        body["tool_choice"] = "required"
    return body


def cases(n: int, seed: int = SEED):
    rng = random.Random(seed)
    for i in range(n):
        family, schema = random_schema(rng)
        yield i, family, make_body(rng, schema)


def encode(body: dict) -> bytes:
    try:
        return json.dumps(body).encode()
    except RecursionError:
        return deep_dumps(body).encode()


def _check_answer(status: int, body: dict, family: str, i: int) -> str:
    """'ok' or the 4xx's first words; fails on anything else."""
    if status == 200:
        choice = body["choices"][0]
        if choice["finish_reason"] in ("stop", "tool_calls"):  # a clean end is valid JSON
            calls = choice["message"].get("tool_calls")
            json.loads(calls[0]["function"]["arguments"] if calls else choice["message"]["content"])
        return "ok"
    err = body["error"]
    assert 400 <= status < 500 and err["type"] != "internal_error", (i, family, status, err)
    assert "\n" not in err["message"] and len(err["message"]) < 1000, (i, family, err["message"][:2000])
    return " ".join(err["message"].split()[:3])


def test_schema_fuzz_in_process():
    engine = make_engine(grammar=True, max_context=4096)
    engine.tools_format = "hermes"
    outcomes: dict[str, int] = {}
    worst = (0.0, None)
    t_all = time.process_time()
    for i, family, body in cases(FUZZ_CASES):
        raw = encode(body)
        if len(raw) > MAX_BODY_BYTES:
            continue  # a transport answers 413 before any of this
        t0 = time.process_time()
        try:
            from reflex_runtime.api.json_wire import parse_object

            resp = openai_mapping.call(engine, "chat", parse_object(raw))
            status, out = resp.status, resp.body
        except ReflexError as e:
            from reflex_runtime.api.responses import error_response

            r = error_response(e)
            status, out = r.status, r.body
        key = f"{family}: {_check_answer(status, out, family, i)}"
        outcomes[key] = outcomes.get(key, 0) + 1
        spent = time.process_time() - t0
        worst = max(worst, (spent, (i, family)))
        assert spent < CASE_CPU_S, (i, family, spent)
    total = time.process_time() - t_all
    print(f"\n{FUZZ_CASES} cases in {total:.1f} s CPU; slowest {worst[0]:.2f} s (case {worst[1]})")
    for k, v in sorted(outcomes.items(), key=lambda kv: -kv[1]):
        print(f"  {v:5d}  {k}")
    assert sum(outcomes.values()) >= FUZZ_CASES * 0.95  # only over-limit bodies are skipped
    assert sum(v for k, v in outcomes.items() if k.endswith(": ok")) >= FUZZ_CASES * 0.15  # not all refused


# -- through real processes ------------------------------------------------------------------

QUOTA = {"tree": 5, "graph": 5, "deep": 4, "size": 3, "crasher": 5}  # cases per process, by family


def subset_bodies() -> list[tuple[str, dict]]:
    """The first cases of each family up to its quota, and the two reported crashers."""
    picked, left = [], dict(QUOTA)
    for _, family, body in cases(FUZZ_CASES):
        if left[family] > 0 and len(encode(body)) <= MAX_BODY_BYTES:
            left[family] -= 1
            picked.append((family, {**body, "max_tokens": 3}))  # ~0.15 s a token on the CPU
    for n in (2500, 3000):
        picked.append(("crasher", {"messages": ASK, "max_tokens": 3, "response_format": {
            "type": "json_schema", "json_schema": {"name": "f", "schema": ref_chain(n)}}}))
    return picked


def _post(port: int, raw: bytes, timeout: float = 120) -> tuple[int, dict]:
    import http.client

    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", "/v1/chat/completions", raw, {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, json.loads(data)


@pytest.mark.slow
def test_schema_fuzz_subset_through_reflex_serve(smollm2_path, tmp_path):
    with open(tmp_path / "serve.log", "w+b") as log, serve_process(smollm2_path, log=log) as (port, p):
        for family, body in subset_bodies():
            status, out = _post(port, encode(body))
            _check_answer(status, out, family, -1)
            assert p.poll() is None, (family, "serve died")
        status, _ = _post(port, json.dumps({"messages": ASK, "max_tokens": 2}).encode())
        assert status == 200 and p.poll() is None


@pytest.mark.slow
def test_schema_fuzz_subset_through_reflex_stdio(smollm2_path):
    bodies = subset_bodies()
    lines = [encode({"id": j, "op": "generate", **b}).decode() for j, (_, b) in enumerate(bodies)]
    lines.append(json.dumps({"id": "last", "op": "ping"}))
    p = subprocess.run([sys.executable, "-m", "reflex_runtime.cli", "stdio", "--backend", "cpu", "-m", smollm2_path],
                       input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    answers = [json.loads(ln) for ln in p.stdout.splitlines()]
    assert answers[0]["op"] == "ready" and answers[-1] == {**answers[-1], "id": "last", "op": "ping", "ok": True}
    assert len(answers) == len(bodies) + 2  # one answer per line, in order
    for j, ((family, _), a) in enumerate(zip(bodies, answers[1:-1])):
        assert a["id"] == j or (a["id"] is None and "error" in a), (j, a)  # null: refused before its id was read
        if "error" in a:
            assert 400 <= a["error"]["status"] < 500 and a["error"]["type"] != "internal_error", (family, a)
            assert "\n" not in a["error"]["message"]
        else:
            assert a["op"] == "generate", (family, a)
