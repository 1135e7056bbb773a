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

from .gpu.decoder import ARGMAX_PARTS
from .gpu.runner import _int_array


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


def _graph_us(dev, stream, enqueue, reps: int = 20, repeats: int = 20) -> float:
    """Median GPU time of one `enqueue(i)`, measured as a CUDA graph of `reps` calls (i = 0..reps-1)
    so that Python's launch overhead (~8 us) is not in the figure. Callers use i to cycle over the
    layers: repeating one layer's weights would time reads from the 50 MB L2, not from memory.
    Cycling helps only as far as the layers' matrices together outgrow the L2: a 28-layer model's
    1-4 MB matrices (28-120 MB in all) are partly, a 4-layer file's attention fully, L2-served."""
    dev.begin_capture(stream)
    try:
        for i in range(reps):
            enqueue(i)
    finally:
        graph = dev.end_capture(stream)
    graph.launch(stream)
    return _events_ms(dev, stream, lambda: graph.launch(stream), repeats) * 1000 / reps


def _row(kernel, w, nbytes, us) -> dict:
    return {"kernel": kernel, "type": w.type_name, "rows": w.rows, "k": w.k, "bytes": nbytes, "us": round(us, 2),
            "gb_s": round(nbytes / (us / 1e6) / 1e9, 1)}


def _spread_experts(runner) -> None:
    """Route the decode token to k experts spread over the stack (ids 0, n/k, 2n/k, ...)."""
    moe, dec = runner.dec.moe, runner.dec
    ids = [i * moe.n_expert // moe.k for i in range(moe.k)]
    ints = runner._in_view.cast("i")
    ints[:moe.k] = _int_array(ids)
    runner.dev.htod(dec.p("moe_ids"), runner._in_ptr, 4 * moe.k, runner.stream)
    runner.dev.memset32(dec.p("moe_w"), 0x3E000000, moe.k, runner.stream)  # 0.125f
    runner.dev.sync(runner.stream)


def kernel_bandwidth(runner) -> list[dict]:
    """Every distinct matrix kind of a layer (and the LM head), one decode token, in GB/s of the
    weight bytes it reads (for routed experts: the k experts' bytes only), cycling over layers."""
    dec, dev, s, ops = runner.dec, runner.dev, runner.stream, runner.ops
    L = dec.layers
    rows = []
    kinds = [("attn_q", "wq"), ("attn_k", "wk"), ("attn_v", "wv"), ("attn_output", "wo")]
    kinds += [("ffn_gate", "wg"), ("ffn_up", "wu"), ("ffn_down", "wd")] if not L[0].moe else []
    x, y = dev.alloc(4 * 65536), dev.alloc(4 * dec.lm_head.rows)
    dev.memset32(x, 0x3C23D70A, 65536, s)  # 0.01f: never time on zeros
    seen = set()
    for name, attr in kinds:
        w = getattr(L[0], attr)
        if (w.type_name, w.rows, w.k) in seen:
            continue
        seen.add((w.type_name, w.rows, w.k))
        us = _graph_us(dev, s, lambda i, attr=attr: ops.matmul(getattr(L[i % len(L)], attr), x, y, 1),
                       reps=max(20, 2 * len(L)))
        rows.append(_row(f"matvec {name}", w, w.rows * w.row_bytes, us))
    us = _graph_us(dev, s, lambda i: ops.matmul(dec.lm_head, x, y, 1), reps=5)
    rows.append(_row("matvec lm_head", dec.lm_head, dec.lm_head.rows * dec.lm_head.row_bytes, us))
    if L[0].moe:
        moe, p = dec.moe, dec.p
        _spread_experts(runner)
        m0 = L[0].moe
        us = _graph_us(dev, s, lambda i: ops.matmul_segments([L[i % len(L)].moe.router], x, [p("moe_logits")], 1))
        rows.append(_row("matvec ffn_router", m0.router, m0.router.rows * m0.router.row_bytes, us))
        us = _graph_us(dev, s, lambda i: ops.moe_glu_mv(L[i % len(L)].moe.gate, L[i % len(L)].moe.up, m0.gate_up_stride,
                                                         p("moe_ids"), moe.k, x, p("moe_act"), 1, moe.n_ff, 0))
        rows.append(_row(f"experts gate+up ({moe.k} of {moe.n_expert})", m0.gate, 2 * moe.k * m0.gate_up_stride, us))
        us = _graph_us(dev, s, lambda i: ops.moe_down_mv(L[i % len(L)].moe.down, m0.down_stride, p("moe_ids"),
                                                          p("moe_w"), moe.k, p("moe_act"), y, 1, moe.n_embd))
        rows.append(_row(f"experts down ({moe.k} of {moe.n_expert})", m0.down, moe.k * m0.down_stride, us))
    dev.free(x)
    dev.free(y)
    return rows


def step_breakdown(runner, ctx: int = 256) -> list[dict]:
    """GPU time of each launch kind in one decode step at a context of `ctx` tokens."""
    dec, dev, s, ops, c = runner.dec, runner.dev, runner.stream, runner.ops, runner.config
    ids = [1] * ctx
    pos = list(range(ctx))
    runner._write_inputs(ids, pos, pos, n_kv=ctx)
    dev.sync(s)
    L, p = dec.layers, dec.p
    from .gpu.ops import ATTN_SPLITS_DECODE

    last = ctx - 1
    # each entry enqueues its launches for layer ly; timed cycling over the layers (see _graph_us)
    kinds: dict = {
        "qkv (fused norm)": lambda ly: dec._qkv(ly, p("x"), p("q"), p("k"), p("v"), 1, ly.attn_norm, c.rms_eps),
        "qk-norm + rope + cache store": lambda ly: ops.qk_rope_store(
            p("q"), p("k"), p("v"), ly.q_norm, ly.k_norm, p("pos") + 4 * last, p("slot") + 4 * last, p("kv_pos"),
            ly.k_cache, ly.v_cache, 1, c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v, c.rope_dim, ly.rope_base, 1.0,
            c.rms_eps, dec.n_ctx),
        f"attention (ctx {ctx}, up to {ATTN_SPLITS_DECODE} slices, merged in-kernel)": lambda ly: ops.attention(
            p("q"), ly.k_cache, ly.v_cache, p("kv_pos"), p("pos") + 4 * last, p("slot") + 4 * last, 0, 0, p("n_kv"),
            p("att"), p("part_o"), p("part_ml"), p("attn_counters"), 1, c.n_head, c.n_head_kv, c.head_dim,
            c.head_dim_v, dec.n_ctx, ly.window, dec.attn_scale, 0.0, ATTN_SPLITS_DECODE),
        "attn output (+residual)": lambda ly: ops.matmul(ly.wo, p("att"), p("o"), 1),
    }
    if L[0].moe:
        moe = dec.moe
        _spread_experts(runner)
        kinds.update({
            "router (fused norm)": lambda ly: ops.matmul_segments([ly.moe.router], p("x"), [p("moe_logits")], 1,
                                                                  norm_w=ly.ffn_norm, eps=c.rms_eps),
            f"top-{moe.k} of {moe.n_expert}": lambda ly: ops.moe_topk(p("moe_logits"), 1, moe.n_expert, moe.k,
                                                                      moe.normalize, p("moe_pair_tok"), p("moe_pair_id")),
            "experts gate/up + act (fused norm)": lambda ly: ops.moe_glu_mv(
                ly.moe.gate, ly.moe.up, ly.moe.gate_up_stride, p("moe_ids"), moe.k, p("x"), p("moe_act"), 1, moe.n_ff,
                0, ly.ffn_norm, c.rms_eps),
            "experts down (+residual)": lambda ly: ops.moe_down_mv(ly.moe.down, ly.moe.down_stride, p("moe_ids"),
                                                                   p("moe_w"), moe.k, p("moe_act"), p("o"), 1,
                                                                   moe.n_embd),
        })
    else:
        kinds.update({
            "gate/up + act (fused norm)": lambda ly: ops.gated_ffn_in(ly.wg, ly.wu, p("x"), p("act"), 1, dec.act,
                                                                     p("g"), p("u"), norm_w=ly.ffn_norm, eps=c.rms_eps),
            "down (+residual)": lambda ly: ops.matmul(ly.wd, p("act"), p("o"), 1),
        })
    kinds.update({
        "lm head (fused final norm)": lambda ly: ops.matmul(dec.lm_head, p("x"), p("logits"), 1,
                                                            norm_w=dec.output_norm, eps=c.rms_eps),
        "argmax (2 kernels)": lambda ly: ops.argmax(p("logits"), c.vocab_size, p("amax_v"), p("amax_i"), ARGMAX_PARTS,
                                                    runner._state, 0),
    })
    out = []
    for name, fn in kinds.items():
        before = ops.launches
        fn(L[0])
        n_launch = ops.launches - before
        dev.sync(s)
        us = _graph_us(dev, s, lambda i, fn=fn: fn(L[i % len(L)]), reps=2 * len(L))
        out.append({"kernel": name, "launches": n_launch, "us": round(us, 2)})
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
    if runner.pdl_available():  # the same graph without programmatic dependent launches, for comparison
        runner.pdl = False
        res["decode_without_pdl"] = decode_rate(engine, args.decode_tokens, args.repeats)
        runner.pdl = None
    res["decode"] = decode_rate(engine, args.decode_tokens, args.repeats)
    res["decode_graph_nodes"] = runner.info().get("decode_graph_nodes")
    res["decode_graph_pdl"] = runner.pdl_available()
    res["prefill"] = [prefill_rate(runner, int(n), args.repeats) for n in args.prefill.split(",") if n]
    res["kernels"] = kernel_bandwidth(runner)
    res["decode_step_breakdown"] = step_breakdown(runner)
    t = time.perf_counter()
    for _ in range(args.repeats):
        engine.system1(prompt="The capital of France is", candidates=[" Paris", " London", " Berlin"])
    res["system1_warm_ms"] = round((time.perf_counter() - t) / args.repeats * 1000, 3)
    tok_s = res["decode"]["tok_s_median"]
    res["decode_bytes_per_token"] = nbytes = runner.dec.decode_bytes_per_token()
    res["decode_effective_gb_s"] = round(nbytes * tok_s / 1e9, 1) if tok_s else None
    res["decode_fraction_of_copy"] = round(res["decode_effective_gb_s"] / res["copy_gb_s"], 3) if tok_s else None
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
    print(f"{'kernel':<24} {'type':<5} {'rows':>7} {'k':>6} {'us':>8} {'GB/s':>8}")
    for r in res["kernels"]:
        print(f"{r['kernel']:<24} {r['type']:<5} {r['rows']:>7} {r['k']:>6} {r['us']:>8} {r['gb_s']:>8}")
    print("one decode step, per layer unless noted (GPU time, graph-launched):")
    for r in res["decode_step_breakdown"]:
        print(f"  {r['kernel']:<40} {r['launches']} launch(es) {r['us']:>9} us")
    print(f"system1 warm: {res['system1_warm_ms']} ms")
    return 0
