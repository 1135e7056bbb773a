#!/usr/bin/env python3
"""Whole prompts (prefill + the first pick) by length, for several settings, with the model loaded
once: the GPU time with the host's launches in it (CUDA events around the eager prefill, as
`reflex bench` and llama-bench's pp rows measure), the host's time to enqueue it, and the same
launches replayed as one CUDA graph (the GPU's own time, no host). A prompt's host time is per
launch, so a short prompt can be bound by Python rather than by the GPU (s38).

    python scripts/bench_prompt.py MODEL --tokens 16,64,128,512 --set default --set prompt_splits=false \
        [--set mm_min_tokens=16] [--launch-cost] [--repeats 10] [--out prompt.json]

--set: a comma list of Launcher attributes (gpu/launch.py), as bench_knobs.py's, plus mm_min_tokens
(gpu/products.py MM_MIN_TOKENS: the fewest tokens that take the tensor-core kernels, the routed
experts' grouped ones too). Settings are
measured in rounds (every setting once per round) so that drift falls on all of them alike.
--launch-cost: the host's cost of one launch (a one-block kernel, 2,000 times).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_knobs import parse_setting  # noqa: E402


def prompt_ids(runner, n: int) -> list[int]:
    return [(7 * i + 11) % min(runner.config.vocab_size, 1000) + 1 for i in range(n)]


def measure(runner, n: int, repeats: int) -> dict:
    from reflex_runtime.commands.bench import _events_ms

    dev, s = runner.dev, runner.stream
    ids = prompt_ids(runner, n)
    runner.prefill_greedy(ids)
    dev.sync(s)
    host = []
    for _ in range(repeats):
        t = time.perf_counter()
        runner.prefill_greedy(ids)
        host.append((time.perf_counter() - t) * 1e3)
        dev.sync(s)
    eager = _events_ms(dev, s, lambda: runner.prefill_greedy(ids), repeats)
    launches = runner.prefill_launches(n)
    graph = runner.graph_of(launches)
    graph.launch(s)
    alone = _events_ms(dev, s, lambda: graph.launch(s), repeats)
    return {"tokens": n, "launches": len(launches), "ms": round(eager, 3), "tok_s": round(n / eager * 1e3, 1),
            "host_ms": round(statistics.median(host), 3), "graph_ms": round(alone, 3),
            "graph_tok_s": round(n / alone * 1e3, 1)}


def launch_cost(runner, count: int = 2000) -> dict:
    """Host microseconds a launch of a one-block kernel costs through Kernel.launch (the bindings'
    cuLaunchKernel: 5.7-5.9 us on an H100 host, where libcuda's own through ctypes took 7.0-8.8, s38)."""
    from ctypes import c_long, c_void_p

    dev, s = runner.dev, runner.stream
    buf = dev.alloc(64)
    k = dev.kernel("reflex_gemm_to_half")
    args = [c_void_p(buf), c_void_p(buf + 32), c_long(8)]
    k.launch(1, 256, args, s)
    dev.sync(s)
    t = time.perf_counter()
    for _ in range(count):
        k.launch(1, 256, args, s)
    us = (time.perf_counter() - t) / count * 1e6
    dev.sync(s)
    dev.free(buf)
    return {"kernel": "reflex_gemm_to_half", "launches": count, "host_us_per_launch": round(us, 2)}


def apply(runner, setting: dict, base: dict) -> None:
    from reflex_runtime.gpu import products

    for key, value in {**base, **setting}.items():
        if key == "mm_min_tokens":
            products.MM_MIN_TOKENS = int(value)
        else:
            setattr(runner.launch, key, value)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--tokens", default="16,64,128,512")
    p.add_argument("--set", action="append", default=[], dest="settings")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--launch-cost", action="store_true")
    p.add_argument("--out")
    args = p.parse_args(argv)

    try:
        settings = [(s, parse_setting(s)) for s in (args.settings or ["default"])]
        tokens = [int(t) for t in args.tokens.split(",") if t]
    except ValueError as e:
        p.error(str(e))
    if not tokens or min(tokens) < 1:
        p.error(f"--tokens {args.tokens!r}: a comma list of prompt lengths of at least 1")

    from reflex_runtime.gpu import products
    from reflex_runtime.loader import load_engine

    engine = load_engine(args.model, "cuda")
    runner = engine.runner
    runner.wait_weights()
    for _, kv in settings:
        for k in kv:
            if k != "mm_min_tokens" and not hasattr(runner.launch, k):
                raise SystemExit(f"bench_prompt: the launcher has no knob {k!r}")
    base = {k: (products.MM_MIN_TOKENS if k == "mm_min_tokens" else getattr(runner.launch, k))
            for _, kv in settings for k in kv}
    res = {"date": time.strftime("%Y-%m-%d"), "device": runner.dev.name, "model": args.model,
           "rounds": args.rounds, "repeats": args.repeats, "settings": {}}
    if args.launch_cost:
        res["launch_cost"] = launch_cost(runner)
        print(f"one launch's host time: {res['launch_cost']['host_us_per_launch']} us")
    for r in range(args.rounds):
        for name, kv in settings:
            apply(runner, kv, base)
            rows = [measure(runner, n, args.repeats) for n in tokens]
            res["settings"].setdefault(name, []).append(rows)
            for row in rows:
                print(f"round {r + 1} {name:<28} pp{row['tokens']:<5} {row['ms']:8.3f} ms {row['tok_s']:>10.1f} tok/s"
                      f"  host {row['host_ms']:7.3f} ms ({row['launches']} launches)  graph {row['graph_ms']:7.3f} ms"
                      f" {row['graph_tok_s']:>10.1f} tok/s", flush=True)
    apply(runner, {}, base)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
