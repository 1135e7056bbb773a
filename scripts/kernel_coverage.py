#!/usr/bin/env python3
"""Which kernels, and which kernel files, a GPU test run launched.

    REFLEX_KERNEL_COVERAGE=/tmp/cov python3 -m pytest -m "gpu and quick" tests -n 14   # conftest records
    python3 scripts/kernel_coverage.py /tmp/cov [--json OUT]

tests/conftest.py writes the names each test process launched to PREFIX.<worker>; this unions
them, takes every kernel and the file that defines it from its ops module
(reflex_runtime/gpu/ops/<file>.py owns kernels/<file>.cu's names), and prints per file how many
of its kernels ran, and which files had none.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def kernel_files() -> dict[str, list[str]]:
    """.cu file -> the kernels it defines (its ops module's KERNELS)."""
    from reflex_runtime.gpu.ops import kernel_modules

    return {m.__name__.rsplit(".", 1)[1] + ".cu": list(m.KERNELS) for m in kernel_modules()}


def coverage(launched: set[str], files: dict[str, list[str]]) -> dict:
    names = [n for ks in files.values() for n in ks]
    ran = {f: [n for n in ks if n in launched] for f, ks in files.items()}
    return {"kernels_launched": len(launched & set(names)), "kernels_in_table": len(names),
            "files_touched": sum(1 for r in ran.values() if r), "files_with_kernels": len(files),
            "untouched_files": sorted(f for f, r in ran.items() if not r),
            "unknown_names": sorted(launched - set(names)),
            "per_file": {f: {"launched": len(ran[f]), "kernels": len(ks), "not_launched": sorted(set(ks) - set(ran[f]))}
                         for f, ks in files.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prefix", help="REFLEX_KERNEL_COVERAGE's value in the test run")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    launched: set[str] = set()
    for path in glob.glob(a.prefix + ".*"):
        with open(path) as f:
            launched |= set(json.load(f))
    res = coverage(launched, kernel_files())
    for f, v in sorted(res["per_file"].items()):
        print(f"  {f:<16} {v['launched']:>3}/{v['kernels']:<3} kernels launched")
    print(f"kernel files touched {res['files_touched']}/{res['files_with_kernels']}"
          f" (untouched: {', '.join(res['untouched_files']) or 'none'}); kernels {res['kernels_launched']}/"
          f"{res['kernels_in_table']}" + (f"; names in no file: {res['unknown_names']}" if res["unknown_names"] else ""))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
