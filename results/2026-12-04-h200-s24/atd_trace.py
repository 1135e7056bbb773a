#!/usr/bin/env python3
"""s24 call 4 (experiment, with atd_trace.patch applied to kernels/attn_decode.cuh): where one decode
attention launch's time goes inside the decode graph. Block (0,0,0) of every reflex_attn_decode
launch stamps clock64 at phase points; this replays the greedy decode graph after DEPTH tokens of
context and prints the median of each phase over 4 steps x the model's layers, in microseconds."""
import sys

import numpy as np
from cuda.bindings import driver as cu

from reflex_runtime.gpu.driver import check
from reflex_runtime.loader import load_engine

model = sys.argv[1]
engine = load_engine(model, "cuda", max_context=4096)
runner = engine.runner
runner.wait_weights()
dev, s = runner.dev, runner.stream
g_trace, _ = check(cu.cuModuleGetGlobal(dev.module, b"atd_trace"), "trace")
g_n, _ = check(cu.cuModuleGetGlobal(dev.module, b"atd_trace_n"), "n")
graph = runner.step_graph(greedy=True)
names = ["pre-wait work", "waiting", "q/k loads", "rope+store", "tile in", "scores", "softmax", "PV+loop", "out/merge"]
for depth in (8, 40, 100, 1000):
    ids = [(7 * i + 11) % 1000 + 1 for i in range(depth)]
    runner.prefill_greedy(ids)
    dev.sync(s)
    for _ in range(2):
        graph.launch(s)
    dev.sync(s)
    dev.memset32(int(g_n), 0, 1, s)
    dev.memset32(int(g_trace), 0, 256 * 16 * 2, s)
    for _ in range(4):
        graph.launch(s)
    t = runner._fetch(int(g_trace), (256, 16), np, dtype=np.uint64).astype(np.int64)
    n = int(runner._fetch(int(g_n), (1,), np, dtype=np.uint32)[0])
    t = t[:n]
    ok = t[:, 15] > 0
    t = t[ok]
    c_end = np.where(t[:, 9] > 0, t[:, 9], t[:, 10])
    ghz = np.median((c_end - t[:, 0]) / np.maximum(1, t[:, 15] - t[:, 14]))
    cols = [1, 2, 3, 4, 5, 6, 7, 8]
    rows = []
    prev = t[:, 0]
    for k in cols:
        d = np.where(t[:, k] > 0, t[:, k] - prev, 0)
        rows.append(np.median(d) / ghz / 1e3)
        prev = np.where(t[:, k] > 0, t[:, k], prev)
    rows.append(np.median(c_end - prev) / ghz / 1e3)
    total = np.median(c_end - t[:, 0]) / ghz / 1e3
    gaps = np.diff(t[:, 14])
    print(f"depth {depth}: launches {n} traced {ok.sum()}, n_split {sorted(set(t[:, 11].tolist()))}, "
          f"n_vis {int(np.median(t[:, 12]))}, clock {ghz:.2f} GHz, block (0,0) total {total:.2f} us, "
          f"start-to-start median {np.median(gaps) / 1e3:.2f} us, merged-by-it {int(t[:, 13].sum())}")
    print("   " + "  ".join(f"{nm}={v:.2f}" for nm, v in zip(names, rows)))
