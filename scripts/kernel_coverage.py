#!/usr/bin/env python3
"""Which kernels, and which kernel files, a GPU test run launched.

    REFLEX_KERNEL_COVERAGE=/tmp/cov python3 -m pytest -m "gpu and quick" tests -n 14   # conftest records
    python3 scripts/kernel_coverage.py /tmp/cov [--json OUT]

tests/conftest.py writes the names each test process launched to PREFIX.<worker>; this unions
them, maps every kernel of the manifest's table (reflex_runtime/gpu/kernels.py) to the .cu file
that defines it (its `__global__` declarations, macro-made names included), and prints per file
how many of its kernels ran, and which files had none.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

_PARAM = r"(?:f32|f16|bf16|q\d_\d|q\d_k|\d+)"  # what a macro parameter becomes in a kernel name
_DECL = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(reflex_[A-Za-z0-9_#]+)\s*\(")


def file_patterns(kernels_dir: str) -> dict[str, list[re.Pattern]]:
    """.cu file -> regexes of the kernel names it defines (`a_##name##_l` -> `a_\\w+_l`)."""
    out = {}
    for path in sorted(glob.glob(os.path.join(kernels_dir, "*.cu"))):
        src = re.sub(r"\\\n", " ", open(path).read())  # macro continuations joined
        pats = []
        for name in _DECL.findall(src):
            # after `##` comes a macro parameter (a weight type or a head size) or a literal `_suffix`
            head, *rest = name.split("##")
            pats.append(re.compile("^" + re.escape(head) + "".join(re.escape(p) if p.startswith("_") else _PARAM
                                                                     for p in rest) + "$"))
        if pats:
            out[os.path.basename(path)] = pats
    return out


def coverage(launched: set[str], names: list[str], patterns: dict[str, list[re.Pattern]]) -> dict:
    files: dict[str, dict] = {f: {"kernels": [], "launched": []} for f in patterns}
    unmapped = []
    for n in names:
        owner = next((f for f, ps in patterns.items() if any(p.match(n) for p in ps)), None)
        if owner is None:
            unmapped.append(n)
            continue
        files[owner]["kernels"].append(n)
        if n in launched:
            files[owner]["launched"].append(n)
    untouched = sorted(f for f, v in files.items() if v["kernels"] and not v["launched"])
    return {"kernels_launched": len(launched & set(names)), "kernels_in_table": len(names),
            "files_touched": sum(1 for v in files.values() if v["launched"]),
            "files_with_kernels": sum(1 for v in files.values() if v["kernels"]),
            "untouched_files": untouched, "unmapped_names": unmapped,
            "per_file": {f: {"launched": len(v["launched"]), "kernels": len(v["kernels"]),
                             "not_launched": sorted(set(v["kernels"]) - set(v["launched"]))} for f, v in files.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prefix", help="REFLEX_KERNEL_COVERAGE's value in the test run")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    from reflex_runtime.gpu.kernels import KERNEL_NAMES

    launched: set[str] = set()
    for path in glob.glob(a.prefix + ".*"):
        with open(path) as f:
            launched |= set(json.load(f))
    res = coverage(launched, list(KERNEL_NAMES), file_patterns(os.path.join(ROOT, "kernels")))
    for f, v in sorted(res["per_file"].items()):
        print(f"  {f:<16} {v['launched']:>3}/{v['kernels']:<3} kernels launched")
    print(f"kernel files touched {res['files_touched']}/{res['files_with_kernels']}"
          f" (untouched: {', '.join(res['untouched_files']) or 'none'}); kernels {res['kernels_launched']}/"
          f"{res['kernels_in_table']}" + (f"; names in no file: {res['unmapped_names']}" if res["unmapped_names"] else ""))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
