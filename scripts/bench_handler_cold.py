#!/usr/bin/env python3
"""Cold start of the serverless handler (handlers/app.py) per REFLEX_PARALLEL setting: a
benchmark, not a test. Each run is a fresh process that imports the handler (Lambda's init phase:
the model loads with that many sequence ranges in its cache pool) and answers one direct
`generate` event of one token, as the first invocation of a container does. Cases run
interleaved, one run each per round, so drift hits every case alike.

Reported per case: spawn -> answer (measured here) and the record's own process start -> first
token, medians and per-round differences against the first case.

    python scripts/bench_handler_cold.py --model Q8.gguf --parallel 1,16,64 --runs 10 --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import json
from types import SimpleNamespace
from handlers import app
ctx = SimpleNamespace(function_name="bench", memory_limit_in_mb=3008, aws_request_id="r1", invoked_function_arn="arn")
r = app.lambda_handler({"op": "generate", "prompt": "The capital of France is", "max_tokens": 1}, ctx)
print("RESULT " + json.dumps({"status": r.get("statusCode")}), flush=True)
"""


def one_run(model: str, parallel: int, backend: str) -> dict:
    env = {**os.environ, "REFLEX_MODEL": model, "REFLEX_PARALLEL": str(parallel), "REFLEX_BACKEND": backend,
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=120)
    wall = (time.perf_counter() - t0) * 1000
    status, first = None, None
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            status = json.loads(line[7:])["status"]
            continue
        try:
            d = json.loads(line)
        except ValueError:
            continue
        cold = (d.get("reflex") or {}).get("coldstart") or d.get("coldstart") or {}
        first = cold.get("process_start_to_first_token_ms", first)
    if status != 200:
        raise SystemExit(f"bench_handler_cold: REFLEX_PARALLEL={parallel}: status {status}, exit {p.returncode}: "
                         f"{(p.stderr or p.stdout)[-400:]}")
    return {"spawn_to_answer_ms": round(wall, 1), "process_start_to_first_token_ms": first}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--parallel", default="1,16", help="comma list of REFLEX_PARALLEL values (first: the baseline)")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    cases = [int(x) for x in a.parallel.split(",")]
    one_run(a.model, cases[0], a.backend)  # untimed: the page cache and the driver warm
    runs: dict[int, list] = {c: [] for c in cases}
    for i in range(a.runs):
        order = cases[i % len(cases):] + cases[:i % len(cases)]
        for c in order:
            runs[c].append(one_run(a.model, c, a.backend))
    base = runs[cases[0]]
    summary = {}
    for c in cases:
        rs = runs[c]
        s = {k: statistics.median(r[k] for r in rs if r[k] is not None) for k in rs[0]}
        s["per_round_diff_spawn_ms"] = statistics.median(r["spawn_to_answer_ms"] - b["spawn_to_answer_ms"]
                                                         for r, b in zip(rs, base))
        summary[f"parallel_{c}"] = s
        print(f"REFLEX_PARALLEL={c:<4} spawn->answer p50 {s['spawn_to_answer_ms']:8.1f} ms   record first token p50 "
              f"{s['process_start_to_first_token_ms']:8.1f} ms   per-round vs {cases[0]}: {s['per_round_diff_spawn_ms']:+.1f} ms")
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "handler-cold.json").write_text(json.dumps({"model": a.model, "runs": a.runs, "summary": summary,
                                                        "raw": {str(c): runs[c] for c in cases}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
