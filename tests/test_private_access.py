"""No module in reflex_runtime or handlers reaches into another module's private names (tests may).

Parsed with `ast`, nothing imported. A module M may use a name starting with one underscore
(not a dunder) only where it is M's own:
- `from x import _name` / `import x._name`: never (x is another module);
- `module._name` on a module M imported: never;
- `obj._name` on anything else: only when M itself defines `_name` (a method, class attribute,
  `self._name = ...`, or top-level name of M), i.e. it is a private of one of M's own classes.
A few standard-library names that are public despite the underscore are allowed (`os._exit`).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("reflex_runtime", "handlers")
PUBLIC_UNDERSCORE = {"_exit"}  # os._exit: documented API


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def own_private_names(tree: ast.Module) -> set[str]:
    """The private names a module defines: functions, classes, methods, class attributes,
    attributes assigned on any object (self._x = ..., new._x = ...) and top-level names."""
    own = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(n.name)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            own.add(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
            own.add(n.attr)
        elif isinstance(n, ast.arg):
            own.add(n.arg)
    return {name for name in own if _private(name)}


def violations(source: str, where: str = "<module>") -> list[str]:
    tree = ast.parse(source)
    own = own_private_names(tree)
    modules = set()  # names bound to imported modules
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            for a in n.names:
                modules.add((a.asname or a.name).split(".")[0])
                if any(_private(part) for part in a.name.split(".")):
                    out.append(f"{where}:{n.lineno}: import {a.name}")
        elif isinstance(n, ast.ImportFrom) and n.module != "__future__":
            for a in n.names:
                if _private(a.name) or any(_private(p) for p in (n.module or "").split(".")):
                    out.append(f"{where}:{n.lineno}: from {'.' * n.level}{n.module or ''} import {a.name}")
    for n in ast.walk(tree):
        if not (isinstance(n, ast.Attribute) and _private(n.attr)) or n.attr in PUBLIC_UNDERSCORE:
            continue
        on_module = isinstance(n.value, ast.Name) and n.value.id in modules
        if on_module or n.attr not in own:
            out.append(f"{where}:{n.lineno}: {ast.unparse(n)}")
    return out


def test_no_cross_module_private_access():
    found, checked = [], 0
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            found += violations(path.read_text(), str(path.relative_to(ROOT)))
            checked += 1
    assert checked > 80
    assert not found, "private names used outside their module:\n" + "\n".join(found)


def test_the_check_catches_each_kind():
    bad = """
from .runner import _int_array
from . import _helpers
import os
class A:
    def go(self, runner, mod):
        runner._write_inputs([])
        os._environ
        return mod.thing._cache
"""
    found = violations(bad)
    assert len(found) == 5, found
    good = """
import os
from dataclasses import dataclass
class A:
    _shared = 1
    def __init__(self):
        self._x = 0
    @classmethod
    def make(cls):
        new = cls()
        new._x = A._shared
        return new._x + cls._shared
    def _helper(self):
        return super()._helper() if False else os._exit
def _local():
    return A()._helper()
"""
    assert violations(good) == []
