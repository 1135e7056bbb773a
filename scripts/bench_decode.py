#!/usr/bin/env python3
"""Decode-step kernels on the real shapes, candidate by candidate (a benchmark, not a test).

    python scripts/bench_decode.py [--model FILE.gguf ...] [--depths 128,1024,4096,8192] --out decode.json

1. Matrix-vector launches of one token for the shapes of Qwen3-0.6B (q/k/v, gate/up, o, down, LM
   head), Gemma 3 270M and the Qwen3-30B-A3B MoE (router + top-k, 8 of 128 experts' gate/up and
   down, attention projections, LM head), per weight type. Each candidate runs as a CUDA graph of
   64 launches, chained with PDL as in the decode graph, cycling over copies of the weights that
   together outgrow the 50 MB L2. GB/s = weight bytes read / time, against a device-to-device copy
   (bytes read + written). Candidates: the legacy kernels (reflex_mv_*, with and without PDL) and
   the staged kernels (reflex_mvs_*) at 1 or 2 blocks per SM and two staging budgets.
2. Decode attention at 128, 1,024, 4,096 and 8,192 tokens of context: reflex_attn (16 slices) and
   reflex_attn_decode at several slice sizes and grid sizes, cycling over per-layer caches.
3. With --model: whole greedy decode steps (the captured decode graph) at each depth for the same
   candidates set on the engine's launcher, on one prefill per depth (state rewound between them).
Prints a short table per part and writes everything as JSON (--out), with the date and GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from reflex_runtime.gpu import products  # noqa: E402  (the kernels' launchers; no driver import)
from reflex_runtime.gpu.ops import attention, attn_decode, moe, moe_decode, mvs, sample  # noqa: E402
from reflex_runtime.gpu.ops.common import Weight  # noqa: E402
from reflex_runtime.gpu.ops.sample import RxState  # noqa: E402
from reflex_runtime.gpu.step import Seq, Step  # noqa: E402

L2_CYCLE_BYTES = 256 << 20  # weights cycled per chain: well past the H200's 50 MB L2
CHAIN = 64  # launches per timed graph

# type -> (weights per block, bytes per block)
LAYOUT = {"F16": (1, 2), "Q8_0": (32, 34), "Q4_K": (256, 144), "Q6_K": (256, 210)}

# (name, [rows of each matrix sharing the input], k, kind): kind "mv" = one launch over the
# segments, "glu" = gate/up + act, "head" = LM head (+ fused argmax for the staged kernel)
SHAPES = {
    "qwen3-0.6b": [("q,k,v", [2048, 1024, 1024], 1024, "mv"), ("gate/up", [3072, 3072], 1024, "glu"),
                   ("attn out", [1024], 2048, "mv"), ("down", [1024], 3072, "mv"),
                   ("lm head", [151936], 1024, "head")],
    "gemma3-270m": [("q,k,v", [1024, 256, 256], 640, "mv"), ("gate/up", [2048, 2048], 640, "glu"),
                    ("attn out", [640], 1024, "mv"), ("down", [640], 2048, "mv"), ("lm head", [262144], 640, "head")],
    "qwen3-30b-a3b": [("q,k,v", [4096, 512, 512], 2048, "mv"), ("attn out", [2048], 4096, "mv"),
                      ("lm head", [151936], 2048, "head")],
}
TYPES = {"qwen3-0.6b": ["Q8_0", "Q4_K", "Q6_K"], "gemma3-270m": ["Q8_0", "Q4_K", "Q6_K"], "qwen3-30b-a3b": ["Q8_0"]}

# (name, n_head, n_kv_heads, head_dim)
ATTN_SHAPES = [("qwen3-0.6b", 16, 8, 128), ("gemma3-270m", 4, 1, 256), ("qwen3-30b-a3b", 32, 4, 128)]

# launcher settings per candidate (None: the legacy kernels)
MV_CANDIDATES = {
    "legacy": None,
    "staged": {},
    "staged 2/SM": {"mvs_blocks_per_sm": 2},
    "staged 48K": {"mvs_budget": 48 * 1024},
    "staged 2/SM 48K": {"mvs_blocks_per_sm": 2, "mvs_budget": 48 * 1024},
}
ATTN_CANDIDATES = {"legacy": None, "keys 16": {"attn_min_keys": 16}, "keys 32": {"attn_min_keys": 32},
                   "keys 64": {"attn_min_keys": 64}, "keys 32 grid 1/SM": {"attn_min_keys": 32, "attn_blocks_per_sm": 1},
                   "keys 32 grid 4/SM": {"attn_min_keys": 32, "attn_blocks_per_sm": 4}}
STEP_CANDIDATES = {
    "legacy": {"staged": False, "attn_decode": False},
    "staged": {},
    "staged 2/SM": {"mvs_blocks_per_sm": 2},
    "staged 48K": {"mvs_budget": 48 * 1024},
    "staged attn keys 64": {"attn_min_keys": 64},
    "staged, rope unfused": {"fuse_rope": False},
    "staged, no PDL": {"pdl": False},
}
KNOBS = ("staged", "attn_decode", "mvs_budget", "mvs_blocks_per_sm", "attn_min_keys", "attn_blocks_per_sm", "fuse_rope")


class Bench:
    def __init__(self):
        from reflex_runtime.measure.coldstart import Timeline
        from reflex_runtime.gpu.bootstrap import DeviceBootstrap
        from reflex_runtime.gpu.launch import Launcher

        boot = DeviceBootstrap.start(Timeline())
        self.dev = boot.wait()
        if self.dev is None:
            raise SystemExit(f"bench_decode: no GPU ({boot.error})")
        self.s = boot.stream
        self.L = Launcher(self.dev, self.s)
        self.defaults = {k: getattr(self.L, k) for k in KNOBS}
        self.pool_bytes = 0

    # -- setup -------------------------------------------------------------------------------

    def alloc_random(self, nbytes: int, seed: int) -> int:
        """Device memory filled with random finite halves (so every 2-byte aligned f16 scale, and
        every f32 / bf16 word made of them, is finite)."""
        import numpy as np

        chunk = min(nbytes, 64 << 20) // 2 * 2
        host = np.random.default_rng(seed).standard_normal(chunk // 2).astype(np.float16)
        ptr = self.dev.alloc(nbytes)
        self.dev.htod(ptr, host.ctypes.data, chunk, self.s)
        done = chunk
        while done < nbytes:  # double what is there
            n = min(done, nbytes - done)
            self.dev.dtod(ptr + done, ptr, n, self.s)
            done += n
        self.dev.sync(self.s)
        return ptr

    def set(self, knobs: dict | None) -> None:
        for k, v in self.defaults.items():
            setattr(self.L, k, v)
        if knobs is None:
            self.L.staged = self.L.attn_decode = False
            return
        for k, v in knobs.items():
            setattr(self.L, k, v)

    def time_chain(self, calls, pdl: bool, repeats: int = 5) -> float:
        """us per launch of the calls captured as one graph (PDL-chained or not)."""
        dev, s = self.dev, self.s
        dev.begin_capture(s)
        self.L.pdl = pdl
        try:
            for c in calls:
                c()
        finally:
            self.L.pdl = False
            g = dev.end_capture(s)
        g.launch(s)
        dev.sync(s)
        start, end = dev.event(timing=True), dev.event(timing=True)
        times = []
        for _ in range(repeats):
            dev.record(start, s)
            g.launch(s)
            dev.record(end, s)
            dev.wait_event(end)
            times.append(dev.elapsed_ms(start, end))
        return statistics.median(times) * 1000 / len(calls)

    def copy_gb_s(self) -> float:
        n = 1 << 30
        a, b = self.dev.alloc(n), self.dev.alloc(n)
        self.dev.dtod(b, a, n, self.s)
        start, end = self.dev.event(timing=True), self.dev.event(timing=True)
        times = []
        for _ in range(5):
            self.dev.record(start, self.s)
            self.dev.dtod(b, a, n, self.s)
            self.dev.record(end, self.s)
            self.dev.wait_event(end)
            times.append(self.dev.elapsed_ms(start, end))
        self.dev.free(a)
        self.dev.free(b)
        return 2 * n / (statistics.median(times) / 1000) / 1e9


def weight_copies(pool: int, pool_bytes: int, type_name: str, rows: list[int], k: int) -> list[list]:
    """Copies of the matrices of one launch (its segments), laid out one after another in the
    pool: enough copies to cycle over more than L2_CYCLE_BYTES, as many as fit."""

    bs, ts = LAYOUT[type_name]
    row_bytes = k // bs * ts
    sizes = [-(-r * row_bytes // 256) * 256 for r in rows]
    n = max(2, -(-L2_CYCLE_BYTES // sum(sizes)))
    n = max(1, min(n, pool_bytes // sum(sizes)))
    copies, off = [], 0
    for _ in range(n):
        ws = []
        for r, size in zip(rows, sizes):
            ws.append(Weight(pool + off, type_name, r, k, row_bytes))
            off += size
        copies.append(ws)
    return copies


def bench_matvec(b: Bench, pool: int, pool_bytes: int, copy: float) -> list[dict]:
    L, out = b.L, []
    x = b.alloc_random(4 * 16384, 1)
    nw = b.alloc_random(4 * 16384, 2)
    y = [b.dev.alloc(4 * 262144) for _ in range(3)]
    part_v, part_i = b.dev.alloc(4 * 262144), b.dev.alloc(4 * 262144)
    counter = b.dev.alloc(4)
    b.dev.memset32(counter, 0, 1, b.s)
    st_bufs = [b.dev.alloc(4 * 4096) for _ in range(6)]  # tokens, pos, slot, n_kv, step, out_tokens
    for p in st_bufs:
        b.dev.memset32(p, 0, 4096, b.s)
    state = RxState(*st_bufs)
    for model, shapes in SHAPES.items():
        for type_name in TYPES[model]:
            for name, rows, k, kind in shapes:
                copies = weight_copies(pool, pool_bytes, type_name, rows, k)
                wbytes = sum(w.nbytes for w in copies[0])

                def call(ws, head_pick):
                    if kind == "mv":
                        return lambda: products.segments(L, ws, x, y[:len(ws)], 1, accumulate=False, norm_w=nw, eps=1e-6)
                    if kind == "glu":
                        return lambda: products.gated_ffn_in(L, ws[0], ws[1], x, y[0], 1, 0, y[1], y[2], norm_w=nw, eps=1e-6)

                    def head():
                        if not mvs.head(L, ws[0], x, y[0], nw, 1e-6, (part_v, part_i, counter, state, 0) if head_pick else None):
                            products.matmul(L, ws[0], x, y[0], 1, norm_w=nw, eps=1e-6)
                            if head_pick:
                                sample.argmax(L, y[0], ws[0].rows, part_v, part_i, 128, state, 0)
                    return head

                for cand, knobs in MV_CANDIDATES.items():
                    b.set(knobs)
                    pdls = (True, False) if cand in ("legacy", "staged") else (True,)
                    for pdl in pdls:
                        b.dev.memset32(st_bufs[4], 0, 1, b.s)  # the step counter the pick advances
                        calls = [call(copies[i % len(copies)], kind == "head") for i in range(CHAIN)]
                        us = b.time_chain(calls, pdl)
                        gb = wbytes / (us / 1e6) / 1e9
                        out.append({"model": model, "type": type_name, "matrix": name, "rows": rows, "k": k,
                                    "candidate": cand, "pdl": pdl, "us": round(us, 2), "gb_s": round(gb, 1),
                                    "of_copy": round(gb / copy, 3), "weight_bytes": wbytes, "copies": len(copies)})
    b.set({})
    return out


def bench_moe(b: Bench, pool: int, pool_bytes: int, copy: float) -> list[dict]:
    """Qwen3-30B-A3B's routed FFN for one token: router (F32 128 x 2048) + top-8, then 8 experts'
    gate/up (768 x 2048 each) and down (2048 x 768), Q8_0, random expert ids per launch."""
    import numpy as np


    L, out = b.L, []
    n_expert, k, n_ff, E = 128, 8, 768, 2048
    rb = E // 32 * 34
    gate = Weight(pool, "Q8_0", n_expert * n_ff, E, rb)
    up = Weight(pool + gate.nbytes, "Q8_0", n_expert * n_ff, E, rb)
    down = Weight(pool + 2 * gate.nbytes, "Q8_0", n_expert * E, n_ff, n_ff // 32 * 34)
    router = Weight(pool + 2 * gate.nbytes + down.nbytes, "F32", n_expert, E, 4 * E)
    assert router.ptr + router.nbytes <= pool + pool_bytes
    ids_host = np.stack([np.random.default_rng(i).choice(n_expert, k, replace=False) for i in range(CHAIN)]).astype(np.int32)
    ids = b.dev.alloc(ids_host.nbytes)
    b.dev.htod(ids, ids_host.ctypes.data, ids_host.nbytes, b.s)
    wts = b.alloc_random(4 * k * CHAIN, 3)
    x = b.alloc_random(4 * E, 4)
    nw = b.alloc_random(4 * E, 5)
    act = b.alloc_random(4 * k * n_ff, 6)
    resid = b.alloc_random(4 * E, 7)
    logits, oid, ow = b.dev.alloc(4 * n_expert), b.dev.alloc(4 * k), b.dev.alloc(4 * k)
    counter = b.dev.alloc(4)
    b.dev.memset32(counter, 0, 1, b.s)
    b.dev.sync(b.s)
    gu_bytes, d_bytes = 2 * k * n_ff * rb, k * E * down.row_bytes
    for cand, knobs in MV_CANDIDATES.items():
        b.set(knobs)
        staged = knobs is not None

        def router_call():
            if not (staged and moe_decode.router_topk(L, router, x, nw, 1e-6, logits, k, True, oid, ow, counter)):
                products.segments(L, [router], x, [logits], 1, norm_w=nw, eps=1e-6)
                moe.topk(L, logits, 1, n_expert, k, True, oid, ow)

        def glu_call(i):
            def f():
                if not (staged and mvs.expert_glu(L, gate, up, n_ff * rb, ids + 4 * k * i, k, x, act, n_ff, 0, nw, 1e-6)):
                    moe.glu_mv(L, gate, up, n_ff * rb, ids + 4 * k * i, k, x, act, 1, n_ff, 0, nw, 1e-6)
            return f

        def down_call(i):
            def f():
                if not (staged and moe_decode.down(L, down, E * down.row_bytes, ids + 4 * k * i, wts + 4 * k * i, k,
                                                   act, resid, E, early=True)):
                    moe.down_mv(L, down, E * down.row_bytes, ids + 4 * k * i, wts + 4 * k * i, k, act, resid, 1, E)
            return f

        for part, calls, wbytes in (("router + top-8", [router_call] * CHAIN, router.nbytes),
                                    ("experts gate/up", [glu_call(i) for i in range(CHAIN)], gu_bytes),
                                    ("experts down", [down_call(i) for i in range(CHAIN)], d_bytes),
                                    ("gate/up + down",
                                     [f for i in range(CHAIN // 2) for f in (glu_call(i), down_call(i))],
                                     (gu_bytes + d_bytes) / 2)):
            us = b.time_chain(calls, True)
            gb = wbytes / (us / 1e6) / 1e9
            out.append({"model": "qwen3-30b-a3b", "type": "Q8_0", "matrix": part, "candidate": cand, "pdl": True,
                        "us": round(us, 2), "gb_s": round(gb, 1), "of_copy": round(gb / copy, 3), "weight_bytes": wbytes})
    b.set({})
    return out


def bench_attention(b: Bench, kv_pool: int, kv_bytes: int, copy: float, contexts) -> list[dict]:
    import numpy as np

    L, out = b.L, []
    for model, n_head, n_kvh, hd in ATTN_SHAPES:
        q = b.alloc_random(4 * n_head * hd, 8)
        att = b.dev.alloc(4 * n_head * hd)
        part_o = b.dev.alloc(4 * n_head * attn_decode.SPLITS_MAX * hd)
        part_ml = b.dev.alloc(4 * n_head * attn_decode.SPLITS_MAX * 2)
        counters = b.dev.alloc(4 * attn_decode.counters(n_head))
        b.dev.memset32(counters, 0, attn_decode.counters(n_head), b.s)
        for n_ctx in contexts:
            ints = np.array(list(range(n_ctx)) + [n_ctx - 1, n_ctx - 1, n_ctx], dtype=np.int32)
            dints = b.dev.alloc(ints.nbytes)
            b.dev.htod(dints, ints.ctypes.data, ints.nbytes, b.s)
            kv_pos, q_pos, q_slot, n_kv = dints, dints + 4 * n_ctx, dints + 4 * (n_ctx + 1), dints + 4 * (n_ctx + 2)
            layer = 2 * n_kvh * n_ctx * hd * 2
            n_layers = max(2, min(kv_bytes // layer, -(-L2_CYCLE_BYTES // layer)))
            kv_read = layer  # every key and value once per KV head
            for cand, knobs in ATTN_CANDIDATES.items():
                b.set(knobs)

                def call(i):
                    kc = kv_pool + (i % n_layers) * layer
                    vc = kc + layer // 2

                    def f():
                        if not (knobs is not None and attn_decode.attention(L, 
                                q, kc, vc, kv_pos, q_pos, q_slot, n_kv, att, part_o, part_ml, counters, n_head, n_kvh,
                                hd, hd, n_ctx, 0, 1.0 / hd ** 0.5, 0.0, prefetch=True)):
                            attention.attention(L, q, kc, vc, kv_pos, q_pos, q_slot, 0, 0, n_kv, att, part_o, part_ml,
                                                counters, 1, n_head, n_kvh, hd, hd, n_ctx, 0, 1.0 / hd ** 0.5, 0.0,
                                                attention.SPLITS_DECODE)
                    return f

                us = b.time_chain([call(i) for i in range(CHAIN)], True)
                gb = kv_read / (us / 1e6) / 1e9
                out.append({ "model": model, "context": n_ctx, "candidate": cand, "us": round(us, 2),
                            "gb_s": round(gb, 1), "of_copy": round(gb / copy, 3), "kv_bytes": kv_read,
                            "layers_cycled": n_layers})
    b.set({})
    return out


def bench_steps(model_path: str, depths, n_tokens: int, repeats: int) -> dict:
    """Whole greedy decode steps of a real file at each depth, candidate by candidate."""
    from reflex_runtime.loader import load_engine

    engine = load_engine(model_path, "cuda", max_context=max(4096, max(depths) + n_tokens + 16))
    runner = engine.runner
    runner.wait_weights()  # warm figures: every expert resident
    dev, s, L = runner.dev, runner.stream, runner.launch
    defaults = {k: getattr(L, k) for k in KNOBS}
    res = {"model": model_path, "file_type": engine.config.file_type,
           "bytes_per_token": runner.model.decode_bytes_per_token(), "rows": []}
    start, end = dev.event(timing=True), dev.event(timing=True)
    for depth in depths:
        ids = [(7 * i + 11) % min(runner.config.vocab_size, 1000) + 1 for i in range(depth)]
        runner.prefill_greedy(ids)
        dev.sync(s)
        first = ids[-1]  # any token: a step's time does not depend on which
        for cand, knobs in STEP_CANDIDATES.items():
            for k, v in defaults.items():
                setattr(L, k, v)
            knobs = dict(knobs)
            runner.pdl = knobs.pop("pdl", None)
            for k, v in knobs.items():
                setattr(L, k, v)
            runner.reset_graphs()
            graph = runner.step_graph(greedy=True, context=depth + 1)
            times = []
            for _ in range(repeats):
                runner.write(Step.of(Seq.prompt([first], start=depth)))  # rewind to just after the prefill
                dev.record(start, s)
                for _ in range(n_tokens):
                    graph.launch(s)
                dev.record(end, s)
                dev.wait_event(end)
                times.append(dev.elapsed_ms(start, end))
            ms = statistics.median(times)
            tok_s = n_tokens / (ms / 1000)
            res["rows"].append({"depth": depth, "candidate": cand, "tok_s": round(tok_s, 1),
                                "gb_s_weights": round(res["bytes_per_token"] * tok_s / 1e9, 1),
                                "graph_nodes": graph.n_nodes})
    for k, v in defaults.items():
        setattr(L, k, v)
    runner.pdl = None
    runner.reset_graphs()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", default=[], help="GGUF file for whole decode steps (repeatable)")
    ap.add_argument("--depths", default="128,1024,4096,8192")
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip", default="", help="comma list of parts to skip: matvec,moe,attention")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    try:
        depths = [int(d) for d in args.depths.split(",") if d]
    except ValueError:
        print(f"bench_decode: --depths wants comma-separated integers, got {args.depths!r}", file=sys.stderr)
        return 2
    if not depths or min(depths) < 1:
        print("bench_decode: --depths needs positive token counts", file=sys.stderr)
        return 2
    skip = set(args.skip.split(","))
    t0 = time.perf_counter()
    b = Bench()
    res = {"date": datetime.date.today().isoformat(), "device": b.dev.name, "sm_count": b.dev.sm_count,
           "max_shared": b.dev.max_shared, "smem_per_sm": b.dev.smem_per_sm, "launcher_defaults": b.defaults}
    res["copy_gb_s"] = copy = round(b.copy_gb_s(), 1)
    print(f"{res['date']}  {res['device']}  copy {copy} GB/s (read + written)")
    pool_bytes = 1536 << 20
    pool = b.alloc_random(pool_bytes, 0)
    if "matvec" not in skip:
        res["matvec"] = rows = bench_matvec(b, pool, pool_bytes, copy)
        print(f"\none-token matrix-vector, us per launch and GB/s of weights ({CHAIN}-launch graphs, PDL unless noted):")
        cols = [(c, True) for c in MV_CANDIDATES] + [("legacy", False), ("staged", False)]
        print(f"  {'model':<14} {'type':<5} {'matrix':<9} " +
              " ".join(f"{(c if pdl else c + ' noPDL')[:15]:>15}" for c, pdl in cols))
        for key in dict.fromkeys((r["model"], r["type"], r["matrix"]) for r in rows):
            by = {(r["candidate"], r["pdl"]): r for r in rows if (r["model"], r["type"], r["matrix"]) == key}
            cells = [f"{by[c]['us']:.2f}/{by[c]['gb_s']:.0f}" if c in by else "" for c in cols]
            print(f"  {key[0]:<14} {key[1]:<5} {key[2]:<9} " + " ".join(f"{c:>15}" for c in cells))
    if "moe" not in skip:
        res["moe"] = rows = bench_moe(b, pool, pool_bytes, copy)
        print("\nMoE routed FFN, one token (Qwen3-30B-A3B shapes, Q8_0), us per launch / GB/s:")
        for part in dict.fromkeys(r["matrix"] for r in rows):
            print(f"  {part:<16} " + "  ".join(f"{r['candidate']}: {r['us']:.2f}/{r['gb_s']:.0f}" for r in rows
                                               if r["matrix"] == part))
    if "attention" not in skip:
        kv_bytes = 1 << 30
        kv_pool = b.alloc_random(kv_bytes, 9)
        res["attention"] = rows = bench_attention(b, kv_pool, kv_bytes, copy, depths)
        print("\ndecode attention, us per launch / GB/s of K+V read:")
        for model, ctx in dict.fromkeys((r["model"], r["context"]) for r in rows):
            print(f"  {model:<14} ctx {ctx:>5} " + "  ".join(f"{r['candidate']}: {r['us']:.2f}/{r['gb_s']:.0f}" for r in rows
                                                         if (r["model"], r["context"]) == (model, ctx)))
    res["steps"] = []
    for path in args.model:
        st = bench_steps(path, depths, args.decode_tokens, args.repeats)
        res["steps"].append(st)
        print(f"\nwhole decode steps, {path} ({st['file_type']}, {st['bytes_per_token'] / 1e6:.1f} MB of weights per token), tok/s:")
        cands = list(STEP_CANDIDATES)
        print(f"  {'depth':>6} " + " ".join(f"{c[:18]:>18}" for c in cands))
        for depth in depths:
            by = {r["candidate"]: r for r in st["rows"] if r["depth"] == depth}
            print(f"  {depth:>6} " + " ".join(f"{by[c]['tok_s']:>18}" for c in cands))
    res["bench_s"] = round(time.perf_counter() - t0, 1)
    print(f"\nbench_decode: {res['bench_s']} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
