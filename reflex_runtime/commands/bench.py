"""`reflex bench`: warm microbenchmarks of the CUDA engine (a benchmark, not a test).

- decode tok/s through the captured graph (greedy, EOS ignored), median over repeats; the same
  with a kernel per op (gpu/fused.py's one-kernel step off), without PDL and with the legacy
  decode kernels, for comparison;
- decode tok/s after 128 .. 8,192 tokens of context (`--depths`, llama-bench's -d): GPU time of
  graph replays back to back;
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

from ..gpu.step import Seq, Step


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


def _advances_state(role: str) -> bool:
    return role.startswith("pick") or "argmax" in role


def step_breakdown(runner, context: int = 256, repeats: int = 20) -> list[dict]:
    """GPU time of one decode step at `context` tokens, role by role (the roles the model's
    blocks give their launches: qkv, attention, ffn gate/up, lm head...). Each role's launches
    from every layer are replayed as one CUDA graph, so Python's launch cost (~8 us) is not in
    the figure and the weights come from memory, not from the 50 MB L2, as far as the layers
    together outgrow it (a 28-layer 0.6B model's 1-3 MB matrices only partly do: read those
    rows' GB/s as upper bounds). GB/s counts the weight bytes each role reads. `us_pdl`: the
    same graph chained with programmatic dependent launches (each launch's early weight copies
    then overlap the previous one of its role, as they overlap the previous kernel in a step).
    A role chained with itself overlaps otherwise than inside the step, so the rows are each role's
    cost on its own, not shares of a step (0.6B Q8_0: the four matrix roles take 15.2 us a layer
    here and ~22 us inside the step; results/2026-12-04-h200-s24)."""
    launches = runner.decode_step_launches(context)
    # a pick advances the step counter per replay
    return role_times(runner, launches, repeats, max_replays=runner.model.max_new - context - 2)


ATTENTION_CONTEXTS = (16, 64, 256)


def attention_by_context(runner, contexts=ATTENTION_CONTEXTS, repeats: int = 20) -> list[dict]:
    """The decode step's attention roles alone (no weights; attention, rope, cache store) at a few
    context lengths, as step_breakdown times them: issue 27 asks what attention costs a layer at
    a short context, where the step breakdown's 256 tokens is not short. us_per_launch: one
    layer's launch of that role."""
    out = []
    for c in contexts:
        if c + 3 > runner.model.max_new:
            out.append({"context": c, "skipped": f"context {runner.model.max_new}"})
            continue
        launches = [ln for ln in runner.decode_step_launches(c)
                    if not ln.weight_bytes and ("attention" in ln.role or "rope" in ln.role)]
        for r in role_times(runner, launches, repeats, max_replays=runner.model.max_new - c - 2):
            us = min(r["us"], r.get("us_pdl", r["us"]))
            out.append({"context": c, "role": r["role"], "launches": r["launches"], "us": us,
                        "us_per_launch": round(us / r["launches"], 2)})
    return out


def role_times(runner, launches, repeats: int, max_replays: int) -> list[dict]:
    """step_breakdown's rows for recorded launches (gpu.launch.Launch), grouped by role; roles
    that advance the decode state are left out when replaying them would advance it more than
    max_replays times."""
    dev, s = runner.dev, runner.stream
    roles: dict[str, list] = {}
    for ln in launches:
        roles.setdefault(ln.role, []).append(ln)
    pdl = runner.pdl_available()
    out = []
    for role, group in roles.items():
        if _advances_state(role) and (1 + pdl) * (repeats + 1) * len(group) > max_replays:
            continue
        row = {"role": role, "launches": len(group)}
        for key, chained in (("us", False), ("us_pdl", True)):
            if chained and not pdl:
                continue
            graph = runner.graph_of(group, pdl=chained)
            graph.launch(s)
            row[key] = round(_events_ms(dev, s, lambda: graph.launch(s), repeats) * 1000, 2)
        wbytes = sum(ln.weight_bytes for ln in group)
        us = min(row["us"], row.get("us_pdl", row["us"]))
        row.update(weight_bytes=wbytes, gb_s=round(wbytes / (us / 1e6) / 1e9, 1) if wbytes and us > 0 else None)
        out.append(row)
    return out


def decode_at_depths(runner, depths, n_tokens: int, repeats: int) -> list[dict]:
    """Greedy decode tok/s after `depth` tokens of context (llama-bench -d): the GPU time of
    n_tokens decode-graph replays back to back after one prefill of `depth` tokens, the state
    rewound to just after the prefill for each repeat (median)."""
    dev, s = runner.dev, runner.stream
    out = []
    for depth in depths:
        if depth + n_tokens + 2 > runner.max_context:
            out.append({"depth": depth, "skipped": f"context {runner.max_context}"})
            continue
        graph = runner.step_graph(greedy=True, context=depth + 1)  # the decode's graph at that depth
        ids = [(7 * i + 11) % min(runner.config.vocab_size, 1000) + 1 for i in range(depth)]
        runner.prefill_greedy(ids)
        dev.sync(s)  # the prefill's input copies have left the pinned buffer we rewrite below

        def run():
            for _ in range(n_tokens):
                graph.launch(s)

        times = []
        for _ in range(repeats):
            runner.write(Step.of(Seq.prompt([ids[-1]], start=depth)))  # rewind; any token: the time is the same
            times.append(_events_ms(dev, s, run, 1))
        ms = statistics.median(times)
        out.append({"depth": depth, "tokens": n_tokens, "ms": round(ms, 3), "tok_s": round(n_tokens / (ms / 1000), 1)})
    return out


def decode_rate(engine, n_tokens: int, repeats: int) -> dict:
    from ..engine import Finished, GenerateRequest

    getattr(engine.runner, "wait_weights", lambda: None)()  # warm: every expert resident (gpu/residency.py)
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
    runner.prefill_greedy(ids)
    ms = _events_ms(runner.dev, runner.stream, lambda: runner.prefill_greedy(ids), repeats)
    return {"tokens": n, "ms": round(ms, 3), "tok_s": round(n / (ms / 1000), 1)}


def main(args) -> int:
    from ..loader import load_engine

    depths = [int(d) for d in (getattr(args, "depths", "") or "").split(",") if d]
    ctx = max(depths) + args.decode_tokens + 16 if depths else None
    engine = load_engine(args.model, "cuda", max_context=max(ctx, 4096) if ctx else None)
    runner = engine.runner
    runner.wait_weights()  # warm figures: every expert resident (gpu/residency.py)
    dev = runner.dev
    t0 = time.perf_counter()
    res = {
        "date": datetime.date.today().isoformat(), "device": dev.name, "model": engine.gguf.path,
        "architecture": engine.config.arch, "file_type": engine.config.file_type,
        "weights_bytes": runner.model.weights_bytes,
    }
    res["copy_gb_s"] = round(copy_bandwidth(dev, runner.stream), 1)
    launch = runner.launch
    default = launch.fused_step
    # the other way of running the step than the default: one kernel (gpu/fused.py) or a kernel per op
    launch.fused_step = not default
    runner.reset_graphs()
    other = decode_rate(engine, args.decode_tokens, args.repeats)
    if runner.info().get("decode_fused_step") is True or default:
        res["decode_fused_step_on" if not default else "decode_kernel_per_op"] = other
        res["fused_step_profile"] = runner.fused_profile()  # the one-kernel step op by op
    launch.fused_step = False  # the comparisons below: a kernel per op
    runner.reset_graphs()
    if runner.pdl_available():  # the same graph without programmatic dependent launches, for comparison
        runner.pdl = False
        res["decode_without_pdl"] = decode_rate(engine, args.decode_tokens, args.repeats)
        runner.pdl = None
    if launch.staged or launch.attn_decode:  # the legacy decode kernels on the same file, for comparison
        saved = launch.staged, launch.attn_decode
        launch.staged = launch.attn_decode = False
        runner.reset_graphs()
        res["decode_legacy_kernels"] = decode_rate(engine, args.decode_tokens, args.repeats)
        res["decode_legacy_graph_nodes"] = runner.info().get("decode_graph_nodes")
        launch.staged, launch.attn_decode = saved
    launch.fused_step = default
    runner.reset_graphs()
    res["decode"] = decode_rate(engine, args.decode_tokens, args.repeats)
    res["decode_graph_nodes"] = runner.info().get("decode_graph_nodes")
    res["decode_graph_pdl"] = runner.pdl_available()
    res["decode_fused_step"] = runner.info().get("decode_fused_step")  # True, or why the step is a kernel per op
    from ..gpu.launch import FUSED_KNOBS

    res["decode_kernels"] = {"staged": launch.staged, "attn_decode": launch.attn_decode,
                             "mvs_budget": launch.mvs_budget, "mvs_blocks_per_sm": launch.mvs_blocks_per_sm,
                             "mvs_waves": launch.mvs_waves, "mvs_head_stream": launch.mvs_head_stream,
                             "post_fold": launch.post_fold,
                             "attn_min_keys": launch.attn_min_keys, "attn_blocks_per_sm": launch.attn_blocks_per_sm,
                             "attn_head_groups": launch.attn_head_groups, "attn_out_merge": launch.attn_out_merge,
                             "attn_out_merge_k": launch.attn_out_merge_k, "attn_group_kernels": launch.attn_group_kernels,
                             "attn_tc": launch.attn_tc, "attn_tc_min_keys": launch.attn_tc_min_keys, "attn_tc_from": launch.attn_tc_from,
                             "fuse_rope": launch.fuse_rope, "fused_step": launch.fused_step,
                             **{k: getattr(launch, k) for k in FUSED_KNOBS}}
    if depths:
        res["decode_at_depth"] = decode_at_depths(runner, depths, args.decode_tokens, max(1, min(args.repeats, 3)))
    res["prefill"] = [prefill_rate(runner, int(n), args.repeats) for n in args.prefill.split(",") if n]
    res["decode_step_breakdown"] = step_breakdown(runner)
    res["attention_by_context"] = attention_by_context(runner)
    n_pb = args.prefill_breakdown
    if n_pb and n_pb + 2 > runner.max_context:  # as decode_at_depths skips a depth past the context
        res["prefill_breakdown"] = {"tokens": n_pb, "skipped": f"context {runner.max_context}", "roles": []}
    elif n_pb:  # the prompt's roles (prefill_launches), replayed one by one as the step's
        res["prefill_breakdown"] = {"tokens": n_pb, "roles": role_times(
            runner, runner.prefill_launches(n_pb), max(1, min(args.repeats, 5)), max_replays=0)}
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
    print(f"decode step fused into one kernel: {res['decode_fused_step']}")
    if "decode_fused_step_on" in res:
        print(f"decode with the step fused into one kernel (REFLEX_FUSED_STEP=1): "
              f"{res['decode_fused_step_on']['tok_s_median']} tok/s")
    if "decode_kernel_per_op" in res:
        print(f"decode with a kernel per op: {res['decode_kernel_per_op']['tok_s_median']} tok/s")
    if "decode_without_pdl" in res:
        print(f"decode with a kernel per op, without PDL: {res['decode_without_pdl']['tok_s_median']} tok/s")
    if "decode_legacy_kernels" in res:
        print(f"decode with the legacy decode kernels: {res['decode_legacy_kernels']['tok_s_median']} tok/s "
              f"(graph of {res['decode_legacy_graph_nodes']} nodes)")
    for d in res.get("decode_at_depth", []):
        print(f"decode at depth {d['depth']:>5}: " + (f"{d['tok_s']:>8} tok/s ({d['tokens']} tokens, graph replays)"
                                                     if "tok_s" in d else f"skipped ({d['skipped']})"))
    for p in res["prefill"]:
        print(f"prefill {p['tokens']:>5} tokens: {p['ms']:8.3f} ms  {p['tok_s']:>10.1f} tok/s")
    print("one decode step at 256 tokens of context, by role, every layer's launches (GPU time, graph-replayed;"
          " us_pdl: chained with PDL):")
    print(f"  {'role':<34} {'launches':>8} {'us':>9} {'us_pdl':>9} {'us/launch':>9} {'GB/s':>8}")
    for r in res["decode_step_breakdown"]:
        best = min(r["us"], r.get("us_pdl", r["us"]))
        print(f"  {r['role']:<34} {r['launches']:>8} {r['us']:>9} {r.get('us_pdl', ''):>9} {best / r['launches']:>9.2f} "
              f"{r['gb_s'] if r['gb_s'] is not None else '':>8}")
    print("the step's attention alone by context (us a layer, the best of plain and PDL-chained):")
    for r in res["attention_by_context"]:
        print(f"  {r['context']:>5} tokens  " + (f"skipped ({r['skipped']})" if "skipped" in r else
                                                 f"{r['role']:<40} {r['us_per_launch']:>7.2f} us a layer"))
    if "prefill_breakdown" in res:
        pb = res["prefill_breakdown"]
        print(f"one {pb['tokens']}-token prefill by role (the pick left out)"
              + (f": skipped ({pb['skipped']})" if "skipped" in pb else ":"))
        for r in pb["roles"]:
            print(f"  {r['role']:<34} {r['launches']:>8} {r['us']:>9} {r.get('us_pdl', ''):>9}")
    if res.get("fused_step_profile"):
        print("the decode step as one kernel, by role, from block 0's start: the last block's start (release), "
              "input and first tile in (ready), the last block's end (work); then the barrier:")
        print(f"  {'role':<40} {'ops':>5} {'us release':>10} {'us ready':>9} {'us work':>9} {'us barrier':>10} {'GB/s':>8}")
        for r in res["fused_step_profile"]:
            print(f"  {r['role']:<40} {r['ops']:>5} {r.get('us_release', ''):>10} {r.get('us_ready', ''):>9} "
                  f"{r['us_work']:>9} {r.get('us_barrier', ''):>10} {r.get('gb_s') or '':>8}")
    print(f"system1 warm: {res['system1_warm_ms']} ms")
    if "kv_cache_bytes_per_token" in res:
        kv = res["kv_cache_bytes_per_token"]
        print(f"KV cache per token of context (f16): latent {kv['latent']} bytes, expanded heads {kv['expanded']} bytes "
              f"({kv['expanded_over_latent']}x)")
    return 0
