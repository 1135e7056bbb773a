"""No import cycles inside reflex_runtime and handlers.

Every module is parsed with `ast` (nothing is imported); each `import` and `from ... import`
statement, wherever it sits (top level, inside a function, under `if TYPE_CHECKING`), becomes an
edge to the modules it names. Importing `a.b.c` also runs `a/__init__` and `a/b/__init__`, so those
packages are targets too, except the importer's own enclosing packages (already initialized by
the time any of its code runs). A strongly connected component with more than one module (or a
module that imports itself) is a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("reflex_runtime", "handlers")


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the packages (a package is its __init__)."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _is_package(name: str, mods: dict[str, Path]) -> bool:
    return mods[name].name == "__init__.py"


def _resolve(importer: str, level: int, module: str | None, mods: dict[str, Path]) -> str:
    """The absolute name a (possibly relative) `from` import refers to."""
    if level == 0:
        return module or ""
    base = importer.split(".")
    if not _is_package(importer, mods):
        base = base[:-1]  # a module's relative imports start at its package
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _with_parents(name: str, importer: str, mods: dict[str, Path]) -> set[str]:
    """`name` and the packages above it that importing it runs, limited to our modules."""
    own = {".".join(importer.split(".")[:i]) for i in range(1, importer.count(".") + 1)}
    parts = name.split(".")
    targets = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return {t for t in targets if t in mods and t not in own and t != importer} | ({name} & {importer})


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(name, node.level, node.module, mods)
                names = [target]
                # `from pkg import sub` imports the submodule pkg.sub when there is one.
                names += [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in mods]
            for n in names:
                graph[name] |= _with_parents(n, name, mods)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (no recursion limit to worry about)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    return [c for c in strongly_connected(graph) if len(c) > 1 or c[0] in graph[c[0]]]


def test_the_graph_sees_every_kind_of_import():
    g = import_graph()
    assert "reflex_runtime.errors" in g["reflex_runtime.engine"]  # top level, relative
    assert "reflex_runtime.loader" in g["reflex_runtime.cli"]  # inside a function
    assert "reflex_runtime.measure.coldstart" in g["handlers.app"]  # absolute, across packages
    assert "reflex_runtime.gpu" in g["reflex_runtime.loader"]  # a package run on the way to a submodule


def test_the_detector_finds_a_planted_cycle():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}, "e": {"a"}}
    assert sorted(cycles(g)) == [["a", "b", "c"], ["d"]]


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)
