"""`reflex bench`: warm microbenchmarks of the CUDA engine (a benchmark, not a test).

- decode tok/s through the captured graph (greedy, EOS ignored), median over repeats;
- prefill tok/s at several prompt lengths (CUDA events around prefill + first pick);
- one decode step role by role (qkv, attention, ffn, experts, lm head...): GPU time and GB/s of
  the weights each reads, against a measured device-to-device copy (bytes read + written / time);
- system1 warm latency for three one-token candidates;
- for latent-cache families (deepseek2), the KV-cache bytes per token, latent against expanded.
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


def step_breakdown(runner, context: int = 256, repeats: int = 20) -> list[dict]:
    """GPU time of one decode step at `context` tokens, role by role (the roles the model's
    blocks give their launches: qkv, attention, ffn gate/up, lm head...). Each role's launches
    from every layer are replayed as one CUDA graph, so Python's launch cost (~8 us) is not in
    the figure and the weights come from memory, not from the 50 MB L2, as far as the layers
    together outgrow it (a 28-layer 0.6B model's 1-3 MB matrices only partly do: read those
    rows' GB/s as upper bounds). GB/s counts the weight bytes each role reads."""
    dev, s = runner.dev, runner.stream
    launches = runner.decode_step_launches(context)
    roles: dict[str, list] = {}
    for ln in launches:
        roles.setdefault(ln.role, []).append(ln)
    max_replays = runner.model.max_new - context - 2  # the pick advances the step counter per replay
    out = []
    for role, group in roles.items():
        if role.startswith("pick") and (repeats + 1) * len(group) > max_replays:
            continue
        graph = runner.graph_of(group)
        graph.launch(s)
        us = _events_ms(dev, s, lambda: graph.launch(s), repeats) * 1000
        wbytes = sum(ln.weight_bytes for ln in group)
        out.append({"role": role, "launches": len(group), "us": round(us, 2),
                    "weight_bytes": wbytes, "gb_s": round(wbytes / (us / 1e6) / 1e9, 1) if wbytes else None})
    return out


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
    runner.prefill(ids)
    ms = _events_ms(runner.dev, runner.stream, lambda: runner.prefill(ids), repeats)
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
        "weights_bytes": runner.model.weights_bytes,
    }
    res["copy_gb_s"] = round(copy_bandwidth(dev, runner.stream), 1)
    if runner.pdl_available():  # the same graph without programmatic dependent launches, for comparison
        runner.pdl = False
        res["decode_without_pdl"] = decode_rate(engine, args.decode_tokens, args.repeats)
        runner.pdl = None
    res["decode"] = decode_rate(engine, args.decode_tokens, args.repeats)
    res["decode_graph_nodes"] = runner.info().get("decode_graph_nodes")
    res["decode_graph_pdl"] = runner.pdl_available()
    res["prefill"] = [prefill_rate(runner, int(n), args.repeats) for n in args.prefill.split(",") if n]
    res["decode_step_breakdown"] = step_breakdown(runner)
    t = time.perf_counter()
    for _ in range(args.repeats):
        engine.system1(prompt="The capital of France is", candidates=[" Paris", " London", " Berlin"])
    res["system1_warm_ms"] = round((time.perf_counter() - t) / args.repeats * 1000, 3)
    tok_s = res["decode"]["tok_s_median"]
    res["decode_bytes_per_token"] = nbytes = runner.model.decode_bytes_per_token()
    res["decode_effective_gb_s"] = round(nbytes * tok_s / 1e9, 1) if tok_s else None
    res["decode_fraction_of_copy"] = round(res["decode_effective_gb_s"] / res["copy_gb_s"], 3) if tok_s else None
    kv_bytes = getattr(runner.model, "kv_cache_bytes_per_token", None)  # latent-cache families (deepseek2)
    if kv_bytes is not None:
        res["kv_cache_bytes_per_token"] = kv_bytes()
    res["bench_s"] = round(time.perf_counter() - t0, 2)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"{res['date']}  {res['device']}  {res['model']}  ({res['file_type']})")
    print(f"decode: {tok_s} tok/s (graph of {res['decode_graph_nodes']} nodes, PDL {'on' if res['decode_graph_pdl'] else 'off'}; "
          f"{nbytes / 1e6:.1f} MB of weights per token -> {res['decode_effective_gb_s']} GB/s vs copy {res['copy_gb_s']} GB/s)")
    if "decode_without_pdl" in res:
        print(f"decode without PDL: {res['decode_without_pdl']['tok_s_median']} tok/s")
    for p in res["prefill"]:
        print(f"prefill {p['tokens']:>5} tokens: {p['ms']:8.3f} ms  {p['tok_s']:>10.1f} tok/s")
    print("one decode step at 256 tokens of context, by role, every layer's launches (GPU time, graph-replayed):")
    print(f"  {'role':<34} {'launches':>8} {'us':>9} {'us/launch':>9} {'GB/s':>8}")
    for r in res["decode_step_breakdown"]:
        print(f"  {r['role']:<34} {r['launches']:>8} {r['us']:>9} {r['us'] / r['launches']:>9.2f} "
              f"{r['gb_s'] if r['gb_s'] is not None else '':>8}")
    print(f"system1 warm: {res['system1_warm_ms']} ms")
    if "kv_cache_bytes_per_token" in res:
        kv = res["kv_cache_bytes_per_token"]
        print(f"KV cache per token of context (f16): latent {kv['latent']} bytes, expanded heads {kv['expanded']} bytes "
              f"({kv['expanded_over_latent']}x)")
    return 0
