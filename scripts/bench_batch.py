#!/usr/bin/env python3
"""Decode throughput of the CUDA runner's batch API (gpu/batch.py) at several batch sizes, without
a server in front: N sequences with P-token prompts (prefilled first), then A tokens each, all
decoding together. Prints a table and writes JSON (--out): per N, aggregate generated tok/s
over the decode phase, ms per step, and the prefill time. A benchmark, not a test.

    python scripts/bench_batch.py MODEL.gguf --seqs 1,2,4,8,16,32,64 --prompt 128 --answer 128 --out batch.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(runner, vocab: int, n: int, prompt: int, answer: int, seed: int) -> dict:
    import numpy as np

    from reflex_runtime.gpu.step import Pick

    rng = np.random.default_rng(seed)
    prompts = [list(rng.integers(10, vocab - 10, prompt)) for _ in range(n)]
    sids = [runner.batch_open(p, Pick(), answer, frozenset()) for p in prompts]
    got = {s: 0 for s in sids}
    t0 = time.perf_counter()
    for s, toks in runner.batch_step([(s, prompt) for s in sids], []).items():
        got[s] += len(toks)
    t1 = time.perf_counter()
    steps = 0
    while any(v < answer for v in got.values()):
        for s, toks in runner.batch_step([], [s for s in sids if got[s] < answer]).items():
            got[s] += len(toks)
        steps += 1
    t2 = time.perf_counter()
    for s in sids:
        runner.batch_close(s)
    decoded = n * (answer - 1)  # the first token of each came from the prefill
    return {"seqs": n, "prefill_s": round(t1 - t0, 4), "decode_s": round(t2 - t1, 4),
            "tok_s": round(decoded / (t2 - t1), 1), "ms_per_step": round((t2 - t1) * 1000 / max(1, answer - 1), 3),
            "calls": steps}


def profile(runner, vocab: int, n: int, prompt: int, repeats: int = 20) -> list[dict]:
    """One n-row decode step role by role (reflex bench's role_times: each role's recorded
    launches replayed as a graph): where the step's time goes."""
    import numpy as np

    from reflex_runtime.commands.bench import role_times
    from reflex_runtime.gpu.ops import sample
    from reflex_runtime.gpu.ops.sample import RxRows
    from reflex_runtime.gpu.step import Pick

    rng = np.random.default_rng(0)
    answer = 64
    sids = [runner.batch_open(list(rng.integers(10, vocab - 10, prompt)), Pick(), answer, frozenset())
            for _ in range(n)]
    runner.batch_step([(s, prompt) for s in sids], [])
    runner.batch_step([], sids)  # the rows are written and a step runs
    m, L, dev = runner.model, runner.launch, runner.dev
    dev.sync(runner.stream)
    with L.record() as launches:
        m.forward(n, first=0, rows=True, logit_row=0, logit_rows=n)
        with L.role("pick rows"):
            sample.pick_rows(L, m.p("logits"), vocab, m.p("sampling_rows"),
                             RxRows(m.p("tokens"), m.p("pos"), m.p("slot"), m.p("steps")), n)
    dev.sync(runner.stream)
    # a replayed pick moves every row one slot on: within their ranges (context prompt + answer + 8)
    out = role_times(runner, launches, repeats, max_replays=answer - 8)
    for s in sids:
        runner.batch_close(s)
    return sorted(out, key=lambda r: -r["us"])


def sweep(runner, vocab: int, sizes, a, rows: list, **tag) -> None:
    """bench every batch size (the best of a.repeat runs; the first captures the graphs) into rows."""
    for n in sizes:
        best = max((run(runner, vocab, n, a.prompt, a.answer, k) for k in range(a.repeat)), key=lambda r: r["tok_s"])
        best.update(tag)
        rows.append(best)
        print(f"{n:>5} {best['tok_s']:>9.1f} {best['ms_per_step']:>8.3f} {best['prefill_s']:>9.4f}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--seqs", default="1,2,4,8,16,32,64")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--answer", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=2, help="runs per size (the best is kept; the first captures graphs)")
    ap.add_argument("--rows-mm-min", type=int, default=0,
                    help="also run every size with products.ROWS_MM_MIN_TOKENS set to this (the decode rows' "
                         "tensor-core crossover)")
    ap.add_argument("--profile", default="", help="batch sizes whose decode step is timed role by role")
    ap.add_argument("--out")
    a = ap.parse_args()
    from reflex_runtime.loader import load_engine

    sizes = [int(x) for x in a.seqs.split(",")]
    eng = load_engine(a.model, "cuda", max_context=a.prompt + a.answer + 8, max_seqs=max(sizes))
    runner = eng.runner
    runner.wait_weights()  # warm figures: every expert resident
    if runner.max_seqs < max(sizes):
        print(f"this model decodes at most {runner.max_seqs} sequences together", file=sys.stderr)
        return 2
    rows = []
    print(f"{'seqs':>5} {'tok/s':>9} {'ms/step':>8} {'prefill s':>9}")
    sweep(runner, eng.config.vocab_size, sizes, a, rows)
    if a.rows_mm_min:
        from reflex_runtime.gpu import products

        saved, products.ROWS_MM_MIN_TOKENS = products.ROWS_MM_MIN_TOKENS, a.rows_mm_min
        runner.reset_graphs()
        print(f"with the tensor-core kernels from {a.rows_mm_min} rows:")
        sweep(runner, eng.config.vocab_size, sizes, a, rows, rows_mm_min_tokens=a.rows_mm_min)
        products.ROWS_MM_MIN_TOKENS = saved
        runner.reset_graphs()
    profiles = {}
    for n in [int(x) for x in a.profile.split(",") if x]:
        profiles[n] = profile(runner, eng.config.vocab_size, n, a.prompt)
        print(f"profile of a {n}-row step (us per step, role by role):")
        for r in profiles[n]:
            print(f"  {r['us']:10.2f}  {r['launches']:4d}  {r['role']}")
    res = {"model": os.path.basename(a.model), "prompt": a.prompt, "answer": a.answer, "device": runner.info()["device"],
           "rows": rows, "profiles": profiles, "command": " ".join(sys.argv)}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
