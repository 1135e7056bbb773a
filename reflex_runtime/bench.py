"""`reflex bench`: warm microbenchmarks of the CUDA engine (a benchmark, not a test).

- decode tok/s through the captured graph (greedy, EOS ignored), median over repeats;
- prefill tok/s at several prompt lengths (CUDA events around prefill + first pick);
- per-kernel GB/s: each distinct weight matrix's matrix-vector kernel, bytes read / time,
  against a measured device-to-device copy (bytes read + written / time);
- system1 warm latency for three one-token candidates.
Prints a table and writes JSON with the date and GPU.
"""

from __future__ import annotations

import datetime
import json
import statistics
import time


def _events_ms(dev, stream, fn, repeats: int) -> float:
    start, end = dev.event(timing=True), dev.event(timing=True)
    times = []
    for _ in range(repeats):
        dev.record(start, stream)
        fn()
        dev.record(end, stream)
        dev.wait_event(end)
        times.append(dev.elapsed_ms(start, end))
    return statistics.median(times)


def copy_bandwidth(dev, stream, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy, counting bytes read + written, in GB/s."""
    a, b = dev.alloc(nbytes), dev.alloc(nbytes)
    dev.dtod(b, a, nbytes, stream)  # warm
    ms = _events_ms(dev, stream, lambda: dev.dtod(b, a, nbytes, stream), 10)
    dev.free(a)
    dev.free(b)
    return 2 * nbytes / (ms / 1000) / 1e9


def kernel_bandwidth(runner, repeats: int = 50) -> list[dict]:
    dec, dev, s, ops = runner.dec, runner.dev, runner.stream, runner.ops
    seen, rows = set(), []
    ly = dec.layers[0]
    cands = [("attn_q", ly.wq), ("attn_k", ly.wk), ("attn_v", ly.wv), ("attn_output", ly.wo), ("ffn_gate", ly.wg),
             ("ffn_up", ly.wu), ("ffn_down", ly.wd), ("lm_head", dec.lm_head)]
    x, y = dev.alloc(4 * 65536), dev.alloc(4 * max(w.rows for _, w in cands))
    dev.memset32(x, 0x3C23D70A, 65536, s)  # 0.01f: never time on zeros
    for name, w in cands:
        key = (w.type_name, w.rows, w.k)
        if key in seen:
            continue
        seen.add(key)
        ms = _events_ms(dev, s, lambda w=w: ops.matmul(w, x, y, 1), repeats)
        nbytes = w.rows * w.row_bytes
        rows.append({"tensor": name, "type": w.type_name, "rows": w.rows, "k": w.k, "bytes": nbytes,
                     "us": round(ms * 1000, 2), "gb_s": round(nbytes / (ms / 1000) / 1e9, 1)})
    dev.free(x)
    dev.free(y)
    return rows


def decode_rate(engine, n_tokens: int, repeats: int) -> dict:
    from .engine import Finished, GenerateRequest

    rates = []
    for _ in range(repeats + 1):  # the first run captures the graph
        rec = None
        for ev in engine.generate(GenerateRequest(prompt="The capital of France is", max_tokens=n_tokens, ignore_eos=True)):
            if isinstance(ev, Finished):
                rec = ev.record
        rates.append(rec["decode_tokens_per_s"])
    return {"tokens": n_tokens, "tok_s_median": statistics.median(rates[1:]), "tok_s_runs": rates[1:]}


def prefill_rate(runner, n: int, repeats: int) -> dict:
    ids = [(7 * i + 11) % min(runner.config.vocab_size, 1000) + 1 for i in range(n)]
    pos = list(range(n))

    def once():
        runner._write_inputs(ids, pos, pos, n_kv=n)
        runner._prefill(n)
        runner._pick(True, n - 1)

    once()
    ms = _events_ms(runner.dev, runner.stream, once, repeats)
    return {"tokens": n, "ms": round(ms, 3), "tok_s": round(n / (ms / 1000), 1)}


def main(args) -> int:
    from .loader import load_engine

    engine = load_engine(args.model, "cuda")
    runner = engine.runner
    dev = runner.dev
    t0 = time.perf_counter()
    res = {
        "date": datetime.date.today().isoformat(), "device": dev.name, "model": engine.gguf.path,
        "architecture": engine.config.arch, "file_type": engine.config.file_type,
        "weights_bytes": runner.dec.weights_bytes,
    }
    res["copy_gb_s"] = round(copy_bandwidth(dev, runner.stream), 1)
    res["decode"] = decode_rate(engine, args.decode_tokens, args.repeats)
    res["decode_graph_nodes"] = runner.info().get("decode_graph_nodes")
    res["prefill"] = [prefill_rate(runner, int(n), args.repeats) for n in args.prefill.split(",") if n]
    res["kernels"] = kernel_bandwidth(runner)
    t = time.perf_counter()
    for _ in range(args.repeats):
        engine.system1(prompt="The capital of France is", candidates=[" Paris", " London", " Berlin"])
    res["system1_warm_ms"] = round((time.perf_counter() - t) / args.repeats * 1000, 3)
    tok_s = res["decode"]["tok_s_median"]
    res["decode_bytes_per_token"] = runner.dec.weights_bytes
    res["decode_effective_gb_s"] = round(runner.dec.weights_bytes * tok_s / 1e9, 1) if tok_s else None
    res["bench_s"] = round(time.perf_counter() - t0, 2)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"{res['date']}  {res['device']}  {res['model']}  ({res['file_type']})")
    print(f"decode: {tok_s} tok/s (graph of {res['decode_graph_nodes']} nodes; ~{res['decode_effective_gb_s']} GB/s "
          f"of weights vs copy {res['copy_gb_s']} GB/s)")
    for p in res["prefill"]:
        print(f"prefill {p['tokens']:>5} tokens: {p['ms']:8.3f} ms  {p['tok_s']:>10.1f} tok/s")
    print(f"{'tensor':<12} {'type':<5} {'rows':>7} {'k':>6} {'us':>8} {'GB/s':>8}")
    for r in res["kernels"]:
        print(f"{r['tensor']:<12} {r['type']:<5} {r['rows']:>7} {r['k']:>6} {r['us']:>8} {r['gb_s']:>8}")
    print(f"system1 warm: {res['system1_warm_ms']} ms")
    return 0
