#!/usr/bin/env python3
"""For the next session (not run yet): with mvs_trace.patch applied to kernels/mvs.cuh (and the fatbin
rebuilt), where each one-token matrix kernel of the 0.6B decode graph spends its time. Every block of
every reflex_mvs_* launch stamps %globaltimer at entry, after its PDL wait, after x, with its weights in
and at its end; this replays the greedy decode graph after DEPTH tokens of context (one step traced) and
prints, per kind of launch (qkv, output, gate/up, down, LM head), the medians over the layers of:
  release   the launch's last wait returning, after the previous matrix launch's last block ended
            (for the output projection: the attention between them included)
  x         last block with x loaded, after its wait
  weights   last block with its tile in, after the last wait (what the staging before the wait left)
  compute   last block's end after the last tile in
and the launch's span (first entry to last end). Usage: python3 mvs_trace.py MODEL [DEPTH]"""
import sys

import numpy as np
from cuda.bindings import driver as cu

from reflex_runtime.gpu.driver import check
from reflex_runtime.loader import load_engine

model, depth = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 8
engine = load_engine(model, "cuda", max_context=4096)
runner = engine.runner
runner.wait_weights()
dev, s = runner.dev, runner.stream
g_trace, _ = check(cu.cuModuleGetGlobal(dev.module, b"mvs_trace"), "trace")
g_n, _ = check(cu.cuModuleGetGlobal(dev.module, b"mvs_trace_n"), "n")
graph = runner.step_graph(greedy=True)
runner.prefill_greedy([(7 * i + 11) % 1000 + 1 for i in range(depth)])
for _ in range(2):
    graph.launch(s)
dev.sync(s)
dev.memset32(int(g_n), 0, 1, s)
graph.launch(s)
n = int(runner._fetch(int(g_n), (1,), np, dtype=np.uint32)[0])
t = runner._fetch(int(g_trace), (1 << 16, 8), np, dtype=np.uint64)[:min(n, 1 << 16)].astype(np.int64)
# launches: runs of consecutive tickets with the same tag (K << 32 | blocks)
cuts = np.flatnonzero(np.diff(t[:, 0])) + 1
launches = np.split(t, cuts)
cfg = runner.config
rows = []
prev_end = None
for ln in launches:
    i = len(rows)  # a dense layer's four launches in order, then the LM head
    kind = ("qkv", "output", "gate/up", "down")[i % 4] if i < 4 * cfg.n_layers else "lm head"
    entry, wait, xin, landed, end = (ln[:, i] for i in (1, 2, 3, 4, 5))
    r = {"kind": kind, "blocks": len(ln), "span": (end.max() - entry.min()) / 1e3,
         "x": (xin - wait).max() / 1e3, "weights": max(0, landed.max() - wait.max()) / 1e3,
         "compute": (end.max() - landed.max()) / 1e3,
         "release": (wait.max() - prev_end) / 1e3 if prev_end is not None else float("nan"),
         "early": (wait.max() - entry.min()) / 1e3}
    rows.append(r)
    prev_end = end.max()
print(f"{len(launches)} matrix launches traced ({n} blocks), context {depth}")
for kind in ("qkv", "output", "gate/up", "down", "lm head"):
    rs = [r for r in rows if r["kind"] == kind]
    if rs:
        med = {k: float(np.nanmedian([r[k] for r in rs])) for k in ("span", "early", "release", "x", "weights", "compute")}
        print(f"  {kind:<8} x{len(rs):<3} " + "  ".join(f"{k}={v:.2f}" for k, v in med.items()))
