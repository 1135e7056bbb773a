"""Bounds on a JSON schema (`response_format`, tool `parameters`) before the grammar engine sees it.

llguidance compiles a schema by native recursion, so its shape is bounded here first, by iterative
walks (no Python recursion either: no schema can raise RecursionError):
- nesting: at most Limits.max_schema_depth JSON levels in one schema (the schema object is level 1);
- size: at most Limits.max_schema_nodes objects and arrays in one schema;
- $ref chains: at most Limits.max_ref_chain $ref hops along any path from the root. Local refs
  (`#`, `#/json/pointer`) are followed; every ref inside a cycle counts once, which bounds how
  deep a compile that visits each definition once can recurse through it;
- finiteness (schema_finite.py): some finite JSON value satisfies the schema.
A failure is a RequestError naming the field where the bound was passed.
"""

from __future__ import annotations

from ..errors import RequestError
from . import schema_finite
from .json_wire import field_path


class SchemaIndex:
    """Every object and array of one schema, numbered in walk order (0 is the root), with its
    path, its children and, for objects with a resolvable local `$ref`, the referenced one."""

    def __init__(self, schema, field: str, limits):
        self.field = field
        self.nodes: list = [schema]
        self.paths: list[tuple] = [()]
        self.kids: list[list[int]] = [[]]
        self.nested_ids = False  # a "$id" below the root: refs may resolve against another base
        self._number = {id(schema): 0}
        self._walk(limits)
        self.refs = [self._ref_target(n) for n in self.nodes]

    def _walk(self, limits) -> None:
        stack = [0]
        while stack:
            i = stack.pop()
            node, path = self.nodes[i], self.paths[i]
            if len(path) >= limits.max_schema_depth:
                raise RequestError(f"'{self.field}' is nested more than {limits.max_schema_depth} levels deep",
                                   field=field_path(self.field, path))
            if isinstance(node, dict):
                items = node.items()
                if i and "$id" in node:
                    self.nested_ids = True
            else:
                items = enumerate(node)
            for k, v in items:
                if not isinstance(v, (dict, list)):
                    continue
                j = self._number.get(id(v))  # one object reached twice (only built in Python, never parsed)
                if j is None:
                    if len(self.nodes) >= limits.max_schema_nodes:
                        raise RequestError(f"'{self.field}' has more than {limits.max_schema_nodes} objects and "
                                           "arrays", field=field_path(self.field, path + (k,)))
                    j = len(self.nodes)
                    self._number[id(v)] = j
                    self.nodes.append(v)
                    self.paths.append(path + (k,))
                    self.kids.append([])
                    stack.append(j)
                self.kids[i].append(j)

    def resolve(self, ref: str):
        """The value a local `$ref` points at, or None (not local, or not found)."""
        if ref == "#" or ref == "#/":
            return self.nodes[0]
        if not ref.startswith("#/"):
            return None
        from urllib.parse import unquote  # JSON pointers in URI fragments may be percent-encoded

        node = self.nodes[0]
        for token in ref[2:].split("/"):
            token = unquote(token).replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and token in node:
                node = node[token]
            elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
                node = node[int(token)]
            else:
                return None
        return node

    def _ref_target(self, node) -> int | None:
        ref = node.get("$ref") if isinstance(node, dict) else None
        if not isinstance(ref, str):
            return None
        return self._number.get(id(self.resolve(ref)))


def check_ref_chains(ix: SchemaIndex, limit: int) -> None:
    """RequestError when some path from the root follows more than `limit` $refs."""
    succ = [kids + ([t] if t is not None else []) for kids, t in zip(ix.kids, ix.refs)]
    comp, n_comp = _components(succ)
    weight = [0] * n_comp  # refs per component
    site = [None] * n_comp  # one ref of each component, to name
    for i, t in enumerate(ix.refs):
        if t is not None:
            weight[comp[i]] += 1
            site[comp[i]] = site[comp[i]] if site[comp[i]] is not None else i
    comp_succ: list[set] = [set() for _ in range(n_comp)]
    for i, ss in enumerate(succ):
        comp_succ[comp[i]].update(comp[j] for j in ss if comp[j] != comp[i])
    best = [0] * n_comp  # the most refs on a path from this component; successors come first
    for c in range(n_comp):
        best[c] = weight[c] + max((best[d] for d in comp_succ[c]), default=0)
    c, hops = comp[0], 0
    if best[c] <= limit:
        return
    while hops + weight[c] <= limit:  # follow the longest path to the component that passes the bound
        hops += weight[c]
        c = max(comp_succ[c], key=lambda d: best[d])
    raise RequestError(f"'{ix.field}' has a chain of {best[comp[0]]} $ref hops, the limit is {limit}",
                       field=field_path(ix.field, ix.paths[site[c]]))


def _components(succ: list[list[int]]) -> tuple[list[int], int]:
    """Strongly connected components (Tarjan's algorithm, iterative), numbered so that every
    edge between two components goes to a lower number."""
    n = len(succ)
    index, low, comp = [-1] * n, [0] * n, [-1] * n
    on_stack = [False] * n
    stack: list[int] = []
    counter = n_comp = 0
    for root in range(n):
        if index[root] != -1:
            continue
        work = [(root, 0)]
        while work:
            v, pos = work[-1]
            if pos == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack[v] = True
            if pos < len(succ[v]):
                work[-1] = (v, pos + 1)
                w = succ[v][pos]
                if index[w] == -1:
                    work.append((w, 0))
                elif on_stack[w]:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if low[v] == index[v]:
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    comp[w] = n_comp
                    if w == v:
                        break
                n_comp += 1
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
    return comp, n_comp


def check_schema(schema, field: str, limits) -> None:
    """Every bound above, in order; RequestError naming the field where one is passed."""
    ix = SchemaIndex(schema, field, limits)
    check_ref_chains(ix, limits.max_ref_chain)
    if not ix.nested_ids and not schema_finite.satisfiable(schema, ix.resolve):
        raise RequestError(f"no finite JSON value satisfies '{field}' (a part it requires refers back to itself "
                           "without end, or is false)", field=field)
