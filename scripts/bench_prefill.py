#!/usr/bin/env python3
"""Prompt (prefill) kernels on the GPU at hand, one by one (issue 14): the tensor-core products of
kernels/gemm.cu in both tile configurations against matmul.cu's WMMA tiles and the matrix-vector
kernel, per weight type, on the real shapes; the matrix-vector / tensor-core crossover per type;
flash attention against reflex_attn; the grouped MoE experts against the per-expert path.

    python scripts/bench_prefill.py --out results/prefill-kernels.json [--types Q8_0,Q4_K] [--quick]

Shapes: Qwen3-0.6B (K 1024 -> q/k/v 2048/1024/1024 in one launch, gate+up 2x3072, 2048 -> 1024,
3072 -> 1024), Gemma 3 270M (640 -> 1024/256/256, gate+up 2x2048, 1024 -> 640, 2048 -> 640; K-quant
types skip the 640-wide rows, as llama-quantize does), Qwen3-30B-A3B experts (128, top 8, 2048 -> 2x768,
768 -> 2048). Tokens 16, 64, 128, 512, 2048 (and 8..96 for the crossover).
Method: random data (f16 values in [-1, 1] written over the whole weight pool, so every scale field
is finite and every quant byte arbitrary; never zeros), each timing a CUDA graph of many launches
(no Python in the timed path) whose weights are consecutive copies in the pool, more than 96 MB of
them where that fits in 512 launches (beyond the 50 MB L2, as in a real forward pass: a 28-layer
model reads ~600 MB of weights between two uses of a matrix), CUDA events, median of repeats.
Prints a short table; --out writes every number as JSON (with the date and GPU).
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
from reflex_runtime.gpu.ops import attention, flash_attn, gemm, matmul, matvec, moe, norm  # noqa: E402
from reflex_runtime.gpu.ops.common import WEIGHT_TYPES, Weight  # noqa: E402

TOKENS = (16, 64, 128, 512, 2048)
CROSSOVER_TOKENS = (8, 16, 24, 32, 48, 64, 96, 128)
POOL_BYTES = 704 << 20  # one layer of 30B-A3B experts in Q8_0 (641 MB) fits
FOOTPRINT = 96 << 20
MAX_LAUNCHES = 512

# name: [(product, K, rows or [segment rows], gate/up fused)]
DENSE = {
    "qwen3-0.6b": [("qkv", 1024, [2048, 1024, 1024], False), ("attn_out", 2048, [1024], False),
                   ("gate_up", 1024, [3072], True), ("down", 3072, [1024], False)],
    "gemma3-270m": [("qkv", 640, [1024, 256, 256], False), ("attn_out", 1024, [640], False),
                    ("gate_up", 640, [2048], True), ("down", 2048, [640], False)],
}
MOE = dict(n_expert=128, k=8, n_embd=2048, n_ff=768)


class Bench:
    def __init__(self, quick: bool):
        from reflex_runtime.measure.coldstart import Timeline
        from reflex_runtime.gpu.bootstrap import DeviceBootstrap
        from reflex_runtime.gpu.launch import Launcher

        boot = DeviceBootstrap.start(Timeline())
        self.dev = boot.wait()
        if self.dev is None:
            sys.exit(f"no GPU: {boot.error}")
        self.s = boot.stream
        self.L = Launcher(self.dev, self.s)
        self.quick = quick
        self.pool = self._pool(POOL_BYTES)
        self._scratch: dict[str, tuple[int, int]] = {}

    def _pool(self, nbytes: int) -> int:
        import numpy as np

        rng = np.random.default_rng(14)
        host = (rng.random(nbytes // 2, dtype=np.float32) * 2 - 1).astype(np.float16)
        ptr = self.dev.alloc(nbytes + 4096)
        self.dev.htod(ptr, host.ctypes.data, host.nbytes, self.s)
        self.dev.sync(self.s)
        return ptr

    def buf(self, name: str, n_floats: int, fill: float | None = None) -> int:
        """A named device scratch buffer of at least n_floats floats (random normal when new)."""
        import numpy as np

        ptr, have = self._scratch.get(name, (0, 0))
        if have < n_floats:
            if ptr:
                self.dev.free(ptr)
            ptr = self.dev.alloc(4 * n_floats)
            host = (np.random.default_rng(len(name)).standard_normal(n_floats).astype(np.float32) if fill is None
                    else np.full(n_floats, fill, np.float32))
            self.dev.htod(ptr, host.ctypes.data, host.nbytes, self.s)
            self.dev.sync(self.s)
            self._scratch[name] = (ptr, n_floats)
        return ptr

    def weights(self, type_name: str, rows: list[int], k: int, copy: int = 0, base: int = 0) -> list:
        """Copy number `copy` of matrices rows[0] x k, rows[1] x k, ... laid out one after the other
        (256-byte aligned) in the pool from byte `base`; copies follow each other, wrapping around."""
        from reflex_runtime.modelfile.ggml_types import GGML_TYPES_BY_NAME

        t = GGML_TYPES_BY_NAME[type_name]
        rb = k // t.block_size * t.type_size
        sizes = [-(-r * rb // 256) * 256 for r in rows]
        per_pool = max(1, (POOL_BYTES - base) // sum(sizes))
        at = self.pool + base + (copy % per_pool) * sum(sizes)
        out = []
        for r, size in zip(rows, sizes):
            out.append(Weight(at, type_name, r, k, rb))
            at += size
        return out

    @staticmethod
    def copies(nbytes: int) -> int:
        return max(4, min(MAX_LAUNCHES, -(-FOOTPRINT // max(nbytes, 1))))

    def time(self, enqueue, n: int) -> float:
        """Microseconds per call of enqueue(i) for i < n, from a graph replaying all n calls."""
        from cuda.bindings import driver as cu

        enqueue(0)  # eager once: opts kernels into large shared memory before capture, checks the launch
        self.dev.sync(self.s)
        self.dev.begin_capture(self.s)
        try:
            for i in range(n):
                enqueue(i)
        finally:
            g = self.dev.end_capture(self.s)
        start, end = self.dev.event(timing=True), self.dev.event(timing=True)

        def once():
            self.dev.record(start, self.s)
            g.launch(self.s)
            self.dev.record(end, self.s)
            self.dev.wait_event(end)
            return self.dev.elapsed_ms(start, end)

        first = once()
        reps = max(3, min(3 if self.quick else 10, int(20 / max(first, 1e-3))))
        ms = statistics.median(once() for _ in range(reps))
        cu.cuGraphExecDestroy(g.exec)
        cu.cuGraphDestroy(g.graph)
        return ms * 1000 / n


# -- dense products --------------------------------------------------------------------------------

def dense_candidates(b: Bench, type_name: str, k: int, rows: list[int], glu: bool, n: int, with_matvec: bool,
                     crossover_only: bool = False):
    """{candidate: us per call} for one product of a layer at n tokens (crossover_only: the
    launcher's tile choice and the matrix-vector kernel only)."""
    L = b.L
    x = b.buf("x", n * k)
    outs = [b.buf(f"y{i}", n * r) for i, r in enumerate(rows)]
    if glu:
        rows = [rows[0], rows[0]]  # gate, up
        g_buf, u_buf = b.buf("g", n * rows[0]), b.buf("u", n * rows[0])
    nbytes = sum(w.nbytes for w in b.weights(type_name, rows, k))
    copies = b.copies(nbytes)
    layouts = [b.weights(type_name, rows, k, i) for i in range(copies)]

    def ws(i):
        return layouts[i]

    cands = {}
    ok = gemm.ok(L, ws(0)[0])
    auto = gemm.cfg_for(L, n, sum(rows))
    for cfg in ((auto,) if crossover_only else ("l", "s")) if ok else ():
        if glu:
            cands[f"gemm_{cfg}"] = lambda i, cfg=cfg: gemm.glu(L, *ws(i), x, outs[0], n, 0, cfg=cfg)
        else:
            cands[f"gemm_{cfg}"] = lambda i, cfg=cfg: gemm.gemm(L, ws(i), x, outs, n, cfg=cfg)
    if k % 64 == 0 and not crossover_only:
        def wmma(i):
            w = ws(i)
            if glu:
                matmul.mm(L, w[0], x, g_buf, n)
                matmul.mm(L, w[1], x, u_buf, n)
                norm.glu(L, g_buf, u_buf, outs[0], n * rows[0], 0)
            else:
                for wi, y in zip(w, outs):
                    matmul.mm(L, wi, x, y, n)
        cands["wmma"] = wmma
    if with_matvec:
        if glu:
            cands["matvec"] = lambda i: matvec.glu(L, *ws(i), x, outs[0], n, 0)
        else:
            cands["matvec"] = lambda i: products.segments(L, ws(i), x, outs, n)
    res = {name: b.time(fn, copies) for name, fn in cands.items()}
    if ok:
        res["auto"] = res[f"gemm_{auto}"]
        res["auto_cfg"] = auto
    return res, nbytes, copies


def run_dense(b: Bench, types: list[str]) -> tuple[list, dict]:
    records, crossover = [], {}
    for model, prods in DENSE.items():
        for tn in types:
            from reflex_runtime.modelfile.ggml_types import GGML_TYPES_BY_NAME

            qk = GGML_TYPES_BY_NAME[tn].block_size
            usable = [p for p in prods if p[1] % qk == 0]
            if len(usable) < len(prods):
                continue  # K-quants cannot hold Gemma's 640-wide rows
            layer: dict[int, dict] = {}
            ns = sorted(set(TOKENS) | (set(CROSSOVER_TOKENS) if model == "qwen3-0.6b" else set()))
            if b.quick:
                ns = [16, 128, 512]
            for n in ns:
                for name, k, rows, glu in prods:
                    res, nbytes, copies = dense_candidates(b, tn, k, rows, glu, n, with_matvec=n <= 128,
                                                           crossover_only=n not in TOKENS)
                    flops = 2 * n * k * sum(rows) * (2 if glu else 1)
                    rec = {"model": model, "product": name, "type": tn, "tokens": n, "k": k, "rows": rows, "glu": glu,
                           "weight_bytes": nbytes, "copies": copies, "us": {c: round(v, 2) for c, v in res.items()
                                                                            if c != "auto_cfg"},
                           "auto_cfg": res.get("auto_cfg"),
                           "tflops": {c: round(flops / (v * 1e-6) / 1e12, 2) for c, v in res.items()
                                      if c != "auto_cfg"}}
                    records.append(rec)
                    for c, v in res.items():
                        if c != "auto_cfg":
                            layer.setdefault(n, {}).setdefault(c, 0.0)
                            layer[n][c] += v
                print(f"  {model} {tn} n={n}: layer " + ", ".join(f"{c} {v:.1f} us" for c, v in layer[n].items()),
                      file=sys.stderr, flush=True)
            if model == "qwen3-0.6b":
                wins = [n for n in sorted(layer) if "matvec" in layer[n] and "auto" in layer[n]
                        and layer[n]["auto"] <= layer[n]["matvec"]]
                crossover[tn] = {"tokens_where_tensor_cores_win": wins,
                                 "first": wins[0] if wins else None,
                                 "layer_us": {n: {c: round(v, 1) for c, v in layer[n].items()} for n in sorted(layer)}}
    return records, crossover


# -- attention ---------------------------------------------------------------------------------------

def run_attention(b: Bench) -> list:
    import numpy as np

    L, out = b.L, []
    shapes = {"qwen3-0.6b": (16, 8, 128, 0), "gemma3-270m local": (4, 1, 256, 512)}
    for model, (n_head, n_kv, hd, window) in shapes.items():
        for n in ((128, 512) if b.quick else (128, 512, 2048, 4096)):
            n_ctx = n
            q = b.buf("att_q", n * n_head * hd)
            kc = b.pool  # f16 values in [-1, 1]
            vc = b.pool + 2 * n_kv * n_ctx * hd
            ar = np.arange(n, dtype=np.int32)
            pos = b.dev.alloc(4 * n)
            b.dev.htod(pos, ar.ctypes.data, 4 * n, b.s)
            n_kv_d = b.dev.alloc(4)
            nk = np.array([n], np.int32)
            b.dev.htod(n_kv_d, nk.ctypes.data, 4, b.s)
            att = b.buf("att_out", n * n_head * hd)
            b.dev.sync(b.s)
            scale = 1 / hd ** 0.5
            res = {}
            if flash_attn.ok(L, n, hd, hd, n_head, n_kv):
                res["flash"] = b.time(lambda i: flash_attn.attention(L, q, kc, vc, pos, pos, pos, 0, 0, n_kv_d, att, n,
                                                                     n_head, n_kv, hd, n_ctx, window, scale, 0.0), 3)
            res["reflex_attn"] = b.time(lambda i: attention.attention(L, q, kc, vc, pos, pos, pos, 0, 0, n_kv_d, att, 0,
                                                                      0, 0, n, n_head, n_kv, hd, hd, n_ctx, window,
                                                                      scale, 0.0, 1), 1)
            keys = sum(min(t + 1, window) if window else t + 1 for t in range(n))
            flops = 4 * hd * keys * n_head
            out.append({"model": model, "tokens": n, "window": window, "us": {c: round(v, 1) for c, v in res.items()},
                        "tflops": {c: round(flops / (v * 1e-6) / 1e12, 2) for c, v in res.items()}})
            print(f"  attention {model} n={n}: " + ", ".join(f"{c} {v:.1f} us" for c, v in res.items()),
                  file=sys.stderr, flush=True)
            b.dev.free(pos)
            b.dev.free(n_kv_d)
    return out


# -- routed experts ----------------------------------------------------------------------------------

def run_moe(b: Bench, types: list[str]) -> list:
    import numpy as np

    from reflex_runtime.modelfile.ggml_types import GGML_TYPES_BY_NAME
    from reflex_runtime.gpu.ops.moe import MoeGroups

    L, out = b.L, []
    E, F, n_exp, k = MOE["n_embd"], MOE["n_ff"], MOE["n_expert"], MOE["k"]
    for tn in types:
        t = GGML_TYPES_BY_NAME[tn]
        if t.block_size == 1:
            continue  # f32/f16/bf16 experts: 1.2-2.4 GB a layer, not a real file's choice
        wg, wu = b.weights(tn, [n_exp * F, n_exp * F], E)
        gsize = wu.ptr - wg.ptr
        if 2 * gsize + n_exp * E * F // t.block_size * t.type_size > POOL_BYTES:
            continue
        wd = b.weights(tn, [n_exp * E], F, base=2 * gsize)[0]
        for n in ((64, 512) if b.quick else TOKENS):
            pairs = n * k
            rng = np.random.default_rng(n)
            logits = b.buf("moe_logits", n * n_exp)
            host = rng.standard_normal(n * n_exp).astype(np.float32)
            b.dev.htod(logits, host.ctypes.data, host.nbytes, b.s)
            ids, wts = b.buf("moe_ids", pairs), b.buf("moe_w", pairs)
            moe.topk(L, logits, n, n_exp, k, True, ids, wts)
            mt = moe.max_tiles(pairs, n_exp)
            grp = MoeGroups(b.buf("moe_counts", n_exp), b.buf("moe_offsets", n_exp), b.buf("moe_pt", pairs),
                            b.buf("moe_pid", pairs), b.buf("moe_te", mt), b.buf("moe_tm", mt), b.buf("moe_nt", 1), mt)
            x, act = b.buf("moe_x", n * E), b.buf("moe_act", pairs * F)
            g_buf, u_buf, y = b.buf("moe_g", pairs * F), b.buf("moe_u", pairs * F), b.buf("moe_y", pairs * E)
            counters = b.buf("moe_counters_%d" % n, n * gemm.down_col_tiles(E), fill=0.0)  # int zeros
            b.dev.sync(b.s)
            res = {}

            def group(i):
                moe.group(L, ids, pairs, n_exp, k, grp.counts, grp.offsets, grp.pair_tok, grp.pair_id, grp.tile_e,
                          grp.tile_m0, grp.n_tiles)

            if gemm.ok(L, wg):
                def grouped(i):
                    group(i)
                    gemm.moe_glu(L, wg, wu, F * wg.row_bytes, F, grp, x, act, 0)
                    gemm.moe_down(L, wd, E * wd.row_bytes, E, grp, act, wts, k, y, x, counters)
                res["grouped_gemm"] = b.time(grouped, 2)
            if E % 64 == 0 and F % 64 == 0:
                def per_expert(i):
                    group(i)
                    for w, o in ((wg, g_buf), (wu, u_buf)):
                        moe.mm(L, w, F * w.row_bytes, n_exp, F, grp.counts, grp.offsets, grp.pair_tok, grp.pair_id, x, o)
                    norm.glu(L, g_buf, u_buf, act, pairs * F, 0)
                    moe.mm(L, wd, E * wd.row_bytes, n_exp, E, grp.counts, grp.offsets, grp.pair_id, grp.pair_id, act, y)
                    moe.combine(L, y, wts, k, x, E, n)
                res["wmma_per_expert"] = b.time(per_expert, 2)
            if n <= 128:
                def matvec(i):
                    moe.glu_mv(L, wg, wu, F * wg.row_bytes, ids, k, x, act, n, F, 0)
                    moe.down_mv(L, wd, E * wd.row_bytes, ids, wts, k, act, x, n, E)
                res["matvec"] = b.time(matvec, 2)
            flops = 2 * pairs * 3 * E * F
            out.append({"type": tn, "tokens": n, "us": {c: round(v, 1) for c, v in res.items()},
                        "tflops": {c: round(flops / (v * 1e-6) / 1e12, 2) for c, v in res.items()}})
            print(f"  moe {tn} n={n}: " + ", ".join(f"{c} {v:.1f} us" for c, v in res.items()), file=sys.stderr, flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the JSON results here")
    ap.add_argument("--types", help="weight types to time (default: every type the kernels read)")
    ap.add_argument("--quick", action="store_true", help="fewer sizes and repeats (a smoke run)")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: dense, attention, moe")
    args = ap.parse_args()
    types = args.types.split(",") if args.types else list(WEIGHT_TYPES)
    bad = [t for t in types if t not in WEIGHT_TYPES]
    if bad:
        print(f"bench_prefill: unknown weight types {bad} (known: {', '.join(WEIGHT_TYPES)})", file=sys.stderr)
        return 2
    skip = set(filter(None, args.skip.split(",")))
    t0 = time.perf_counter()
    b = Bench(args.quick)
    res = {"date": datetime.date.today().isoformat(), "device": b.dev.name,
           "compute_capability": f"{b.dev.cc[0]}.{b.dev.cc[1]}", "sm_count": b.dev.sm_count}
    if "dense" not in skip:
        res["dense"], res["crossover"] = run_dense(b, types)
    if "attention" not in skip:
        res["attention"] = run_attention(b)
    if "moe" not in skip:
        res["moe"] = run_moe(b, types)
    res["bench_s"] = round(time.perf_counter() - t0, 1)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    print_table(res)
    return 0


def print_table(res: dict) -> None:
    print(f"{res['date']}  {res['device']} (sm_{res['compute_capability'].replace('.', '')}, {res['sm_count']} SMs)"
          f"  {res['bench_s']} s")
    if res.get("dense"):
        print("dense layer (sum of qkv, attn_out, gate_up, down), us; speedup of the launcher's choice over WMMA:")
        rows: dict[tuple, dict] = {}
        for r in res["dense"]:
            d = rows.setdefault((r["model"], r["type"], r["tokens"]), {})
            for c, v in r["us"].items():
                d[c] = d.get(c, 0) + v
        print(f"  {'model':<12} {'type':<5} {'n':>5} {'auto':>9} {'gemm_l':>9} {'gemm_s':>9} {'wmma':>9} {'matvec':>9} {'x wmma':>7}")
        for (model, tn, n), d in sorted(rows.items()):
            if n not in TOKENS:
                continue
            f = lambda c: f"{d[c]:9.1f}" if c in d else f"{'-':>9}"  # noqa: E731
            sp = f"{d['wmma'] / d['auto']:7.2f}" if "wmma" in d and "auto" in d else f"{'-':>7}"
            print(f"  {model:<12} {tn:<5} {n:>5} {f('auto')} {f('gemm_l')} {f('gemm_s')} {f('wmma')} {f('matvec')} {sp}")
    if res.get("crossover"):
        print("matrix-vector -> tensor cores (Qwen3-0.6B layer): first token count where tensor cores win")
        print("  " + ", ".join(f"{tn} {c['first']}" for tn, c in res["crossover"].items()))
    if res.get("attention"):
        print("attention (causal prompt of n tokens, one launch), us (TFLOP/s):")
        for r in res["attention"]:
            print(f"  {r['model']:<18} n={r['tokens']:>5}: " + ", ".join(
                f"{c} {v} ({r['tflops'][c]})" for c, v in r["us"].items()))
    if res.get("moe"):
        print("MoE experts, 128 x top-8, 2048 -> 768 -> 2048 (one layer), us:")
        for r in res["moe"]:
            print(f"  {r['type']:<5} n={r['tokens']:>5}: " + ", ".join(f"{c} {v}" for c, v in r["us"].items()))


if __name__ == "__main__":
    sys.exit(main())
