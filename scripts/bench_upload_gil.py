#!/usr/bin/env python3
"""The cold path's weight upload beside the tokenizer, on the host alone (no GPU): how much the two
slow each other down through the GIL, for each upload mode.

    python scripts/bench_upload_gil.py MODEL.gguf [--modes staged,mapped] [--rounds 3] [--threads 8]
        [--out gil.json]

On the cold path the weights go up on background threads while the main thread builds the
tokenizer's tables (loader.py); on s38's H100 the 633 MB of a Qwen3-0.6B-shaped file went up at
6.4 GB/s beside a tokenizer that took 188 ms (~70 alone). Each mode runs here twice a round, the
tokenizer (Tokenizer.from_gguf + prepare) on the main thread with the upload beside it
("concurrent", as on the cold path) and after it ("serial"), in a fresh process each time, with the
loader's switch interval (0.2 ms) and the collector off. The device is host memory and its copies
are memmoves (ctypes, which drops the GIL, as a driver call does), so `staged` (gpu/upload.py's
staging ring: preadv into buffers, then a copy) and `mapped` (REFLEX_UPLOAD_MAPPED=1: the copy
straight from a populated mapping) do the same bytes of work; what differs is how often a thread
needs the GIL. Only the GPU machine says what the driver's copies cost (results/2026-12-07-cpu-s39).
Page cache warm (the file is read once first). Medians over --rounds; JSON on stdout and in --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CHILD = r"""
import gc, json, os, sys, threading, time
sys.path[:0] = [sys.argv[1], os.path.join(sys.argv[1], "tests")]
from fake_device import HostMemoryDevice
from reflex_runtime.gpu.upload import MappedFile, StagingRing, upload_file_range, upload_mapped
from reflex_runtime.modelfile.gguf_file import GGUFFile
from reflex_runtime.text.tokenizer import Tokenizer

path, mode, concurrent, threads = sys.argv[2], sys.argv[3], sys.argv[4] == "1", int(sys.argv[5])
sys.setswitchinterval(0.0002)  # as loader.load_engine sets it
gc.disable()
g = GGUFFile(path)
n = g.size - g.data_offset
dev, out = HostMemoryDevice(n), {}


def upload():
    t = time.perf_counter()
    if mode == "mapped":
        m = MappedFile(path, g.size)
        out["map_ms"] = (time.perf_counter() - t) * 1e3
        upload_mapped(dev, m, g.data_offset, n, dev.base, threads)
        m.close()
    else:
        upload_file_range(dev, StagingRing(dev, threads), path, g.data_offset, n, dev.base)
    out["upload_ms"] = (time.perf_counter() - t) * 1e3


th = threading.Thread(target=upload)
t0 = time.perf_counter()
if concurrent:
    th.start()
t = time.perf_counter()
tok = Tokenizer.from_gguf(g)
tok.prepare()
out["tokenizer_ms"] = (time.perf_counter() - t) * 1e3
if not concurrent:
    th.start()
th.join()
out["both_done_ms"] = (time.perf_counter() - t0) * 1e3
out["upload_gb_s"] = n / out["upload_ms"] / 1e6
print(json.dumps(out))
"""


def run_once(tree: str, path: str, mode: str, concurrent: bool, threads: int) -> dict:
    r = subprocess.run([sys.executable, "-c", _CHILD, tree, path, mode, "1" if concurrent else "0", str(threads)],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"bench_upload_gil: the {mode} run failed: {r.stderr.strip().splitlines()[-1:]}")
    return json.loads(r.stdout)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--modes", default="staged,mapped")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    modes = [m for m in a.modes.split(",") if m]
    why = (f"--modes takes staged and/or mapped (got {a.modes!r}); --rounds and --threads positive integers"
           if not modes or any(m not in ("staged", "mapped") for m in modes) or min(a.rounds, a.threads) < 1 else
           f"no such model file: {a.model}" if not os.path.isfile(a.model) else None)
    if why:
        print(f"bench_upload_gil: {why}", file=sys.stderr)
        return 2
    with open(a.model, "rb") as f:  # page cache warm
        while f.read(64 << 20):
            pass
    runs: dict = {}
    for _ in range(a.rounds):
        for mode in modes:
            for conc in (True, False):
                key = f"{mode} {'concurrent' if conc else 'serial'}"
                runs.setdefault(key, []).append(run_once(ROOT, a.model, mode, conc, a.threads))
    summary = {key: {k: round(statistics.median(r[k] for r in rs), 2) for k in rs[0]} for key, rs in runs.items()}
    for key, row in summary.items():
        print(f"{key:<18} " + "  ".join(f"{k} {v}" for k, v in row.items()), file=sys.stderr)
    result = {"file": os.path.basename(a.model), "threads": a.threads, "rounds": a.rounds, "cpus": os.cpu_count(),
              "median": summary, "runs": runs}
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
