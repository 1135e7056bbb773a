"""Does some finite JSON value satisfy a schema? `{"$ref": "#"}`, two definitions that refer to
each other, or an object that requires a property of its own type all describe only infinite
values; a grammar built from one can start an output but never end it (issue 30: a 200 carrying
'{"'). Refused before compiling, as a 400.

The answer is over-approximated: "satisfiable" unless every way out is closed, so a schema the
grammar engine can finish is never refused here (contradictions such as `allOf` of two types are
the engine's to report). Each schema object becomes an AND of its parts (its `$ref` target, each
`allOf` item, an OR of its `anyOf`/`oneOf` items, an OR of what its types allow: any scalar type, or
an object whose required properties are all satisfiable, or an array whose first `minItems` items
are); `true`, literals (`const`, `enum`) and anything the rules do not read count as satisfiable.
The least fixed point is found by propagating from the satisfiable leaves, in time linear in the
schema's size, without recursion.
"""

from __future__ import annotations

from typing import Callable

SCALARS = frozenset({"string", "number", "integer", "boolean", "null"})
_TRUE, _FALSE = 0, 1  # an AND of nothing, an OR of nothing


class _Formula:
    def __init__(self):
        self.is_and: list[bool] = [True, False]
        self.parts: list[list[int]] = [[], []]

    def new(self, is_and: bool, parts: list[int] | None = None) -> int:
        self.is_and.append(is_and)
        self.parts.append(parts or [])
        return len(self.parts) - 1

    def solve(self) -> list[bool]:
        n = len(self.parts)
        holds, need = [False] * n, [0] * n
        users: list[list[int]] = [[] for _ in range(n)]
        ready = []
        for i, parts in enumerate(self.parts):
            distinct = set(parts)
            need[i] = len(distinct) if self.is_and[i] else 1
            for p in distinct:
                users[p].append(i)
            if self.is_and[i] and not distinct:
                holds[i] = True
                ready.append(i)
        while ready:
            for u in users[ready.pop()]:
                if not holds[u]:
                    need[u] -= 1
                    if need[u] == 0:
                        holds[u] = True
                        ready.append(u)
        return holds


def satisfiable(schema, resolve: Callable[[str], object]) -> bool:
    """False only when no finite JSON value can satisfy `schema`; `resolve(ref)` returns a local
    $ref's target or None."""
    f = _Formula()
    made: dict[int, int] = {}
    todo: list[tuple[dict, int]] = []

    def node(s) -> int:
        if s is False:
            return _FALSE
        if not isinstance(s, dict):
            return _TRUE  # `true`, or not a schema at all (the engine reports that)
        i = made.get(id(s))
        if i is None:
            i = made[id(s)] = f.new(True)
            todo.append((s, i))
        return i

    def types_part(s: dict) -> int:
        types = s.get("type")
        types = [types] if isinstance(types, str) else types
        if "const" in s or "enum" in s or not isinstance(types, list) or not set(types) <= SCALARS | {"object", "array"}:
            return _TRUE
        if set(types) & SCALARS:
            return _TRUE
        ways = []
        if "object" in types:
            props, required = s.get("properties"), s.get("required")
            if isinstance(props, dict) and isinstance(required, list):
                ways.append(f.new(True, [node(props[r]) for r in required if isinstance(r, str) and r in props]))
            else:
                ways.append(_TRUE)
        if "array" in types:
            ways.append(f.new(True, _array_parts(s, node)))
        return f.new(False, ways)

    root = node(schema)
    while todo:
        s, i = todo.pop()
        parts = f.parts[i]
        ref = s.get("$ref")
        if isinstance(ref, str):
            target = resolve(ref)
            if target is not None:
                parts.append(node(target))
        if isinstance(s.get("allOf"), list):
            parts += [node(x) for x in s["allOf"]]
        for key in ("anyOf", "oneOf"):
            if isinstance(s.get(key), list) and s[key]:
                parts.append(f.new(False, [node(x) for x in s[key]]))
        parts.append(types_part(s))
    return f.solve()[root]


def _array_parts(s: dict, node) -> list[int]:
    """What the first `minItems` items of an array must satisfy."""
    least = s.get("minItems", 0)
    if not isinstance(least, int) or least <= 0:
        return []
    prefix = s.get("prefixItems")
    prefix = prefix if isinstance(prefix, list) else []
    parts = [node(x) for x in prefix[:least]]
    items = s.get("items")
    if least > len(prefix) and isinstance(items, (dict, bool)):
        parts.append(node(items))
    return parts
