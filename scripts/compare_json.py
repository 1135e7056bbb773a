"""results/DATE-GPU/compare.json (../shared/RESULTS.md's one format), written by the benchmark
scripts from what they measured: bench_serve.py (serving rows), bench_coldstart.py (cold start)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def row(file: str, metric: str, ours: float, peer: float, rate: bool) -> dict:
    """ratio = how many times better reflex is: reflex / peer for rates, peer / reflex for times and joules."""
    return {"file": file, "metric": metric, "reflex": ours, "llama_cpp": peer,
            "ratio": round(ours / peer if rate else peer / ours, 3)}


def write_compare(path: Path, rows: list[dict], gpu: str | None, commit: str | None = None) -> None:
    """Merge into path: a row of the same file and metric is replaced, the others are kept. Each
    row says the tree that ran it (rows of one file may come from a later tree than the others)."""
    path = Path(path)
    old = json.loads(path.read_text()) if path.exists() else {}
    commit = commit or subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                      text=True).stdout.strip()
    rows = [{**r, "commit": commit or None} for r in rows]
    keep = [r for r in old.get("rows", []) if (r["file"], r["metric"]) not in {(n["file"], n["metric"]) for n in rows}]
    out = {"date": time.strftime("%Y-%m-%d"), "gpu": gpu, "commit": commit or None, "peer": "llama.cpp (shared/peers)",
           **{k: v for k, v in old.items() if k != "rows"}, "rows": keep + rows}
    path.write_text(json.dumps(out, indent=1) + "\n")
