#!/usr/bin/env python3
"""s25 follow-up of s24's mvs_trace.py (with s24's mvs_trace.patch plus two more stamps: slot 6 the SM,
slot 7 after the block issued its tile and norm-weight loads, just before its PDL wait). Replays one
greedy decode step after DEPTH tokens of context and prints, per kind of matrix launch (medians over
the 28 layers), the per-block distribution (p10 / p50 / max, microseconds) of: entry after the
previous matrix launch's last end, issue time, wait return after that end, x after the wait, tile in
after the wait, end after the tile; and how many SMs held two of its blocks. Saves the raw stamps
to $OUT/mvs_trace2-DEPTH.npz. Usage: python3 mvs_trace2.py MODEL [DEPTH]"""
import os
import sys

import numpy as np
from cuda.bindings import driver as cu

from reflex_runtime.gpu.driver import check
from reflex_runtime.loader import load_engine


def traced(model: str, depth: int, steps=None):
    """The engine warmed at DEPTH tokens of context, its greedy decode graph replayed twice, then
    the stamp counter reset and steps(runner, graph) run (default: one graph launch); returns the
    runner and the stamps, one row of 8 per block (also step_gap.py's)."""
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
    (steps or (lambda r, g: g.launch(s)))(runner, graph)
    dev.sync(s)
    n = int(runner._fetch(int(g_n), (1,), np, dtype=np.uint32)[0])
    return runner, runner._fetch(int(g_trace), (1 << 16, 8), np, dtype=np.uint64)[:min(n, 1 << 16)].astype(np.int64)


def launches_of(t):
    """The stamps split into launches: runs of consecutive tickets with the same tag (K << 32 | blocks)."""
    return np.split(t, np.flatnonzero(np.diff(t[:, 0])) + 1)


def main():
    model, depth = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 8
    runner, t = traced(model, depth)
    np.savez_compressed(os.path.join(os.environ.get("OUT", "."), f"mvs_trace2-{depth}.npz"), t=t)
    launches = launches_of(t)
    nl = runner.config.n_layers
    stats = {}
    prev_end = None
    for i, ln in enumerate(launches):
        kind = ("qkv", "output", "gate/up", "down")[i % 4] if i < 4 * nl else "lm head"
        entry, wait, xin, landed, end, sm, issued = (ln[:, c] for c in (1, 2, 3, 4, 5, 6, 7))
        if prev_end is not None:
            per = {"entry": entry - prev_end, "issue": issued - entry, "wait": wait - prev_end, "x": xin - wait,
                   "tile": landed - wait, "compute": end - landed, "end": end - prev_end}
            _, counts = np.unique(sm, return_counts=True)
            per["2/SM"] = np.array([np.sum(counts > 1)] * len(ln))
            stats.setdefault(kind, []).append({k: v / (1e3 if k != "2/SM" else 1) for k, v in per.items()})
        prev_end = end.max()
    print(f"{len(launches)} matrix launches, context {depth}; us after the previous matrix launch's last end "
          "(entry, wait, end) or after this block's wait (x, tile); p10/p50/max over blocks, median over layers")
    for kind, rs in stats.items():
        cols = []
        for k in ("entry", "issue", "wait", "x", "tile", "compute", "end"):
            q = np.median([[np.percentile(r[k], 10), np.median(r[k]), r[k].max()] for r in rs], axis=0)
            cols.append(f"{k} {q[0]:.2f}/{q[1]:.2f}/{q[2]:.2f}")
        print(f"  {kind:<8} x{len(rs):<3} blocks {len(rs[0]['x'])}  two-a-SM {np.median([r['2/SM'][0] for r in rs]):.0f}  "
              + "  ".join(cols))


if __name__ == "__main__":
    main()
