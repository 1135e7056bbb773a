"""OpenAI `tools` / `tool_choice` and `response_format` -> what the engine runs, and the model's
tool-call output -> `tool_calls`.

- `check_tools(body, engine)` -> ToolPlan: the tools to render through the model's own chat
  template (templates that never read `tools` -> 400 naming "tools"), and for `tool_choice`
  "required" or a named function the grammar that forces the call (grammar.py, llguidance).
- `check_response_format(body, limits)` -> Grammar | None: `{"type": "json_object"}` and
  `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`; the schema is bounded
  (schema_bounds.py) and compiled here, so an invalid one is a 400 naming
  `response_format.json_schema.schema` (or the part of it past a bound).
Tool `parameters` get the same bounds, whether or not a call is forced.
- `HermesCalls`: the calls in Qwen3/Hermes-style output (`<tool_call>{"name", "arguments"}
  </tool_call>`), whole (`parse`) or as text streams in (`feed`/`end`), the form the SDK expects.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from ..errors import RequestError
from .fields import DEFAULT_LIMITS, brief
from .schema_bounds import check_schema

MAX_TOOLS = 128
MAX_TOOLS_CHARS = 65536  # the tools' JSON, all together (it goes into the prompt)
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass
class ToolPlan:
    tools: list[dict] | None  # rendered by the template; None: none
    parse: bool  # look for tool calls in the output
    grammar: object = None  # grammar.Grammar forcing a call ("required" / a named function)


def check_tools(body: dict, engine) -> ToolPlan:
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise RequestError("'tool_choice' needs 'tools'", field="tool_choice")
        return ToolPlan(None, False)
    if engine.tool_call_format is None:
        raise RequestError("this model's chat template does not describe tools to the model (it never reads "
                           "'tools'), so tool calls are not supported with it; use a model whose template does "
                           "(e.g. Qwen3)", field="tools")
    tools = _check_tool_list(tools, engine.limits)
    names = [t["function"]["name"] for t in tools]
    if choice is None or choice == "auto":
        return ToolPlan(tools, True)
    if choice == "none":
        return ToolPlan(None, False)  # the model is not told about tools it may not call
    if choice == "required":
        # One call unless parallel calls are asked for explicitly: small models, once forced, tend
        # to repeat the call until max_tokens (OpenAI's default for parallel_tool_calls is true).
        return ToolPlan(tools, True, _forced_grammar(tools, several=body.get("parallel_tool_calls") is True))
    if (isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict)
            and set(choice) <= {"type", "function"}):
        name = choice["function"].get("name")
        if name not in names:
            raise RequestError(f"'tool_choice' names function {brief(name)}, which is not in 'tools'",
                               field="tool_choice")
        return ToolPlan(tools, True, _forced_grammar([tools[names.index(name)]], several=False))
    raise RequestError("'tool_choice' must be \"none\", \"auto\", \"required\" or "
                       "{\"type\": \"function\", \"function\": {\"name\": ...}}", field="tool_choice")


def _check_strict(d: dict, where: str) -> None:
    if d.get("strict") is not None and not isinstance(d["strict"], bool):
        raise RequestError(f"'{where}.strict' must be true or false, got {brief(d['strict'])}", field=f"{where}.strict")


def _check_tool_list(tools, limits) -> list[dict]:
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise RequestError(f"'tools' must be a list of at most {MAX_TOOLS} tools", field="tools")
    out, seen = [], set()
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise RequestError(f"'{where}' must be {{\"type\": \"function\", \"function\": {{...}}}} (only function "
                               "tools are supported)", field=where)
        f = t["function"]
        unknown = set(f) - {"name", "description", "parameters", "strict"}
        if unknown:
            raise RequestError(f"'{where}.function.{sorted(unknown)[0]}' is not supported", field=f"{where}.function")
        name = f.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise RequestError(f"'{where}.function.name' must be 1-64 letters, digits, '_', '.' or '-', got "
                               f"{brief(name)}", field=f"{where}.function.name")
        if name in seen:
            raise RequestError(f"two tools are named {name!r}", field=f"{where}.function.name")
        seen.add(name)
        if f.get("description") is not None and not isinstance(f["description"], str):
            raise RequestError(f"'{where}.function.description' must be a string", field=f"{where}.function.description")
        _check_strict(f, f"{where}.function")
        params = f.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise RequestError(f"'{where}.function.parameters' must be a JSON schema object",
                               field=f"{where}.function.parameters")
        fn = {"name": name}
        if f.get("description") is not None:
            fn["description"] = f["description"]
        fn["parameters"] = params if params is not None else {"type": "object", "properties": {}}
        out.append({"type": "function", "function": fn})
    if len(json.dumps(out)) > MAX_TOOLS_CHARS:
        raise RequestError(f"'tools' take more than {MAX_TOOLS_CHARS} characters as JSON", field="tools")
    for i, t in enumerate(tools):  # after the size bound: it bounds this work too
        if t["function"].get("parameters") is not None:
            check_schema(t["function"]["parameters"], f"tools[{i}].function.parameters", limits)
    return out


def _forced_grammar(tools: list[dict], several: bool):
    """Output that is one (or, several=True, one or more) Hermes tool call(s) of these tools, each
    `{"name": <one of them>, "arguments": <its parameters schema>}`: llguidance's Lark with
    embedded JSON schemas, compact separators (grammar.JSON_OPTIONS)."""
    from ..text.grammar import JSON_OPTIONS, Grammar

    def call_schema(t, at: str):
        f = t["function"]
        args = rebase_refs(f["parameters"], at + "/properties/arguments")
        return {"type": "object", "properties": {"name": {"const": f["name"]}, "arguments": args},
                "required": ["name", "arguments"], "additionalProperties": False}

    schemas = [call_schema(t, "#" if len(tools) == 1 else f"#/anyOf/{k}") for k, t in enumerate(tools)]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    schema = {**schema, "x-guidance": JSON_OPTIONS}
    more = ' ("\\n" call)*' if several else ""  # Qwen3 puts a newline between parallel calls
    lark = (f"start: call{more}\n"
            f"call: {json.dumps(OPEN + chr(10))} %json {json.dumps(schema)} {json.dumps(chr(10) + CLOSE)}\n")
    g = Grammar.lark(lark, field="tools")
    g.check()  # a parameters schema llguidance cannot compile: 400 naming tools
    return g


def rebase_refs(schema, base: str):
    """A copy of `schema` whose local refs (`#`, `#/...`) point where it now sits, `base` (a JSON
    pointer such as `#/properties/arguments`): parameters keep their own `$defs` when embedded in
    the call's schema. Iterative (schemas are bounded already, but nothing here recurses)."""
    root: list = [None]
    stack = [(schema, root, 0)]
    while stack:
        node, parent, key = stack.pop()
        if isinstance(node, dict):
            copy = dict.fromkeys(node)  # filled below, in the same key order
            for k, v in node.items():
                if k == "$ref" and isinstance(v, str) and (v == "#" or v.startswith("#/")):
                    copy[k] = base + v[1:]
                else:
                    stack.append((v, copy, k))
        elif isinstance(node, list):
            copy = [None] * len(node)
            stack += [(v, copy, j) for j, v in enumerate(node)]
        else:
            copy = node
        parent[key] = copy
    return root[0]


def check_response_format(body: dict, limits=DEFAULT_LIMITS):
    """The grammar `response_format` asks for, or None (absent, or {"type": "text"})."""
    rf = body.get("response_format")
    if rf is None:
        return None
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise RequestError("'response_format' must be an object with a 'type'", field="response_format")
    kind = rf["type"]
    from ..text.grammar import Grammar

    if kind == "text" and set(rf) == {"type"}:
        return None
    if kind == "json_object" and set(rf) == {"type"}:
        g = Grammar.json_object()
    elif kind == "json_schema":
        js = rf.get("json_schema")
        if set(rf) != {"type", "json_schema"} or not isinstance(js, dict):
            raise RequestError("'response_format' of type json_schema takes one 'json_schema' object",
                               field="response_format.json_schema")
        unknown = set(js) - {"name", "schema", "strict", "description"}
        if unknown:
            raise RequestError(f"'response_format.json_schema.{sorted(unknown)[0]}' is not supported",
                               field="response_format.json_schema")
        if not isinstance(js.get("name"), str) or not _NAME.match(js["name"]):
            raise RequestError("'response_format.json_schema.name' must be 1-64 letters, digits, '_', '.' or '-'",
                               field="response_format.json_schema.name")
        _check_strict(js, "response_format.json_schema")
        schema = js.get("schema", {})
        if not isinstance(schema, dict):
            raise RequestError("'response_format.json_schema.schema' must be a JSON schema object",
                               field="response_format.json_schema.schema")
        check_schema(schema, "response_format.json_schema.schema", limits)
        g = Grammar.json_schema(schema, field="response_format.json_schema.schema")
    elif kind in ("text", "json_object"):
        raise RequestError(f"'response_format' of type {kind} takes no other fields", field="response_format")
    else:
        raise RequestError(f"'response_format' type {brief(kind)} is not supported (text, json_object, json_schema)",
                           field="response_format.type")
    g.check()
    return g


# -- the model's output -> tool_calls -------------------------------------------------------------


def _call_id() -> str:
    return "call_" + os.urandom(12).hex()


def _as_call(body: str) -> dict | None:
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return {"id": _call_id(), "type": "function", "function": {"name": obj["name"], "arguments": args}}


class HermesCalls:
    """Splits output text into content and tool calls. `feed(text)` / `end()` return a list of
    ("content", str) and ("call", (index, call dict)) events as the text streams in: content is held back while
    it could still be the start of `<tool_call>`, a call comes out whole when its closing tag (or
    the end) arrives, and a block that is not a JSON call stays content, verbatim."""

    def __init__(self):
        self._buf = ""
        self._in_call = False
        self.calls: list[dict] = []

    def feed(self, text: str) -> list[tuple[str, object]]:
        self._buf += text
        out: list[tuple[str, object]] = []
        while True:
            if self._in_call:
                j = self._buf.find(CLOSE)
                if j < 0:
                    return out
                self._block(self._buf[:j], out)
                self._buf, self._in_call = self._buf[j + len(CLOSE):], False
                continue
            i = self._buf.find(OPEN)
            if i >= 0:
                if i:
                    out.append(("content", self._buf[:i]))
                self._buf, self._in_call = self._buf[i + len(OPEN):], True
                continue
            keep = _partial_suffix(self._buf, OPEN)
            if len(self._buf) > keep:
                out.append(("content", self._buf[:len(self._buf) - keep]))
                self._buf = self._buf[len(self._buf) - keep:]
            return out

    def end(self) -> list[tuple[str, object]]:
        out: list[tuple[str, object]] = []
        if self._in_call:
            self._block(self._buf, out, closed=False)
        elif self._buf:
            out.append(("content", self._buf))
        self._buf, self._in_call = "", False
        return out

    def _block(self, body: str, out: list, closed: bool = True) -> None:
        call = _as_call(body.strip())
        if call is None:
            out.append(("content", OPEN + body + (CLOSE if closed else "")))
        else:
            self.calls.append(call)
            out.append(("call", (len(self.calls) - 1, call)))

    @classmethod
    def parse(cls, text: str) -> tuple[str | None, list[dict]]:
        """(content, calls) of a whole output; content None when only calls (and space) remain."""
        p = cls()
        events = p.feed(text) + p.end()
        content = "".join(v for k, v in events if k == "content")
        if p.calls and not content.strip():
            return None, p.calls
        return (content.strip() if p.calls else content), p.calls


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
