#!/usr/bin/env python3
"""Where the cold path's weight upload spends its time (issue 28; a benchmark, not a test).

For one GGUF file, page cache warm (the file is read once first):
- upload: gpu/upload.py's upload_file_range, the cold path's own copy of the tensor data into a
  device arena, for every --threads x --chunks-mb x --buffers x --pin combination; each twice with the same
  staging ring: "first" pins its buffers inside the timed copy (as the runner's first upload does),
  "again" reuses them (the copy alone);
- read: the same threads preadv-ing the file into pinned buffers with no device copy (the page
  cache's rate: memcpy from the kernel);
- link: host-to-device copies from one pinned 256 MB buffer on 1 and 4 streams (the PCIe link's
  rate, no file in the way);
- pinning: milliseconds per MB to pin 256 MB of staging, per --pin mode (alloc: cuMemHostAlloc;
  thp: huge-page memory registered with cuMemHostRegister).
With --demand N (a MoE file), instead: experts on demand as a first forward asks for them
(gpu/residency.py): the base, then N random experts of each MoE layer in turn, each layer's
ensure() timed (the burst a layer waits for), then the rest in the background; per --threads x
--chunks-mb x --buffers (--pin alloc) x --pack (small experts several to a copy, or not) x
--copies (real; none: no host-to-device copy or kernel, so what is left is Python, threads
and the page cache; noread: the copies without the reads, Python, threads and the device);
burst_cpus: the process's CPU seconds per second of bursts (near 1 with no reads: one GIL);
and the same bursts read alone (reads_gb_s: preadv on the same threads, no device copy and no
WeightStream). These bursts are most of a big MoE file's first forward (220 ms
of the 30B-A3B's 0.754 s, results/2026-12-02-h200-s9). Measured 2026-12-02 on the
Qwen3.5-35B-A3B shape, 8 threads: packs 12.4 GB/s, one copy each 7.4, reads alone 39
(results/2026-12-02-h200-s10).
Prints a table and writes JSON (--out). Needs a GPU.

    python scripts/bench_upload.py /tmp/real/qwen3moe-30b-a3b-48l-q8_0.gguf --threads 4,8,16 \\
        --chunks-mb 2,8 --buffers 2,4 --out upload.json
    python scripts/bench_upload.py /tmp/real/qwen35moe-35b-a3b-q4_k_m.gguf --demand 38 --threads 8,16 \\
        --chunks-mb 2,4 --buffers 2 --pack 1,0 --copies real,none --out demand.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from reflex_runtime.errors import ReflexError  # noqa: E402
from reflex_runtime.gpu.upload import StagingRing, read_chunk, upload_file_range  # noqa: E402
from reflex_runtime.modelfile.gguf_file import GGUFFile  # noqa: E402

MB = 1 << 20


def _device():
    """The GPU with the fatbin loaded, as the cold path brings it up (--demand's packs launch
    kernels/scatter.cu)."""
    from reflex_runtime.gpu.bootstrap import DeviceBootstrap
    from reflex_runtime.measure.coldstart import Timeline

    boot = DeviceBootstrap.start(Timeline())
    dev = boot.wait()
    if dev is None:
        raise SystemExit(f"bench_upload: no GPU: {boot.error}")
    return dev


def gb_s(nbytes: int, seconds: float) -> float:
    return round(nbytes / max(seconds, 1e-9) / 1e9, 2)


def warm_page_cache(path: str) -> float:
    t = time.perf_counter()
    with open(path, "rb") as f:
        while f.read(64 * MB):
            pass
    return time.perf_counter() - t


def read_rate(dev, path: str, offset: int, nbytes: int, threads: int, chunk: int) -> float:
    """GB/s of preadv from the page cache into pinned buffers on `threads` threads (no copy)."""
    bufs = [dev.alloc_pinned(chunk) for _ in range(threads)]
    fd = os.open(path, os.O_RDONLY)
    n_chunks = -(-nbytes // chunk)

    def work(w: int) -> None:
        view = bufs[w][1]
        for c in range(w, n_chunks, threads):
            size = min(chunk, nbytes - c * chunk)
            done = 0
            while done < size:
                done += os.preadv(fd, [view[done:size]], offset + c * chunk + done)

    try:
        t = time.perf_counter()
        ts = [threading.Thread(target=work, args=(w,)) for w in range(threads)]
        for x in ts:
            x.start()
        for x in ts:
            x.join()
        return gb_s(nbytes, time.perf_counter() - t)
    finally:
        os.close(fd)
        for ptr, _ in bufs:
            dev.free_pinned(ptr)


def link_rate(dev, dst: int, streams: int, total: int = 8 << 30, size: int = 256 * MB) -> float:
    """GB/s of host-to-device copies of one pinned buffer, spread over `streams` streams."""
    ptr, _ = dev.alloc_pinned(size)
    ss = [dev.stream() for _ in range(streams)]
    try:
        dev.htod(dst, ptr, size, ss[0])
        dev.sync(ss[0])
        t = time.perf_counter()
        for i in range(total // size):
            dev.htod(dst + (i % 8) * size, ptr, size, ss[i % streams])
        for s in ss:
            dev.sync(s)
        return gb_s(total // size * size, time.perf_counter() - t)
    finally:
        dev.free_pinned(ptr)


def pin_cost(dev, pin: str, total: int = 256 * MB, size: int = 8 * MB) -> float:
    """Milliseconds per MB to pin `total` bytes as `size` buffers, one after another (the cold
    path pins its ring before its first copy)."""
    ring = StagingRing(dev, total // (2 * size), size, 2, pin=pin)
    t = time.perf_counter()
    for w in range(ring.n_threads):
        ring.ensure(dev, w)
    ms = (time.perf_counter() - t) * 1000
    ring.free(dev)
    return round(ms / (total / MB), 3)


class _NoCopies:
    """The device with its host-to-device copies and kernel launches left out (--copies none)."""

    def __init__(self, dev):
        self._dev = dev

    def __getattr__(self, name):
        return getattr(self._dev, name)

    def htod(self, dst, src, nbytes, stream) -> None:
        pass

    def kernel(self, name):
        return self

    def launch(self, *args, **kw) -> None:
        pass


def _add(acc: dict, name: str, seconds: float) -> None:
    """acc[thread][name] += seconds (each thread its own dict: no update lost between threads)."""
    mine = acc.setdefault(threading.get_ident(), {})
    mine[name] = mine.get(name, 0.0) + seconds


class _Timed:
    """The device (or its --copies none stand-in) with each call the upload workers make timed:
    seconds per call kind, summed over threads, into `acc` (each includes getting the GIL back)."""

    CALLS = ("htod", "launch", "record", "wait_event", "sync")

    def __init__(self, dev, acc: dict):
        self._dev, self._acc = dev, acc

    def __getattr__(self, name):
        fn = getattr(self._dev, name)
        if name not in self.CALLS:
            return fn
        acc = self._acc

        def timed(*args, **kw):
            t = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                _add(acc, name, time.perf_counter() - t)
        return timed

    def kernel(self, name):
        k = self._dev.kernel(name)
        return k if k is self._dev else _Timed(k, self._acc)


@contextlib.contextmanager
def _reads(wrap):
    """WeightStream's reads from the file replaced by wrap(the reads in place) for the block."""
    from reflex_runtime.gpu import residency

    real = residency.read_chunk
    residency.read_chunk = wrap(real)
    try:
        yield
    finally:
        residency.read_chunk = real


def _timed_reads(acc: dict):
    """The reads timed into acc["read"] (the call and the GIL after it)."""
    def wrap(real):
        def timed(*args):
            t = time.perf_counter()
            try:
                return real(*args)
            finally:
                _add(acc, "read", time.perf_counter() - t)
        return timed
    return _reads(wrap)


def _no_reads(on: bool):
    """--copies noread: the reads left out (the staging buffers keep whatever they held), the
    copies and kernels kept."""
    return _reads(lambda real: (lambda fd, view, size, offset, path: None) if on else real)


def demand_rate(dev, g, dst: int, threads: int, chunk: int, buffers: int, asked: int, seed: int = 0) -> dict:
    """A first forward's uploads without the forward: the base, then `asked` random experts of each
    MoE layer in order (each ensure() timed), then the rest; the figures WeightStream records, and
    where the workers' time went during the bursts (ms per layer, summed over the workers: reads
    and each driver call, each with the wait for the GIL after it; "other" is the rest: Python,
    the lock, idle)."""
    import random
    import statistics

    from reflex_runtime.gpu.residency import WeightStream, plan_upload

    plan = plan_upload(g)
    acc: dict = {}
    ring = StagingRing(dev, threads, chunk, buffers, pin="alloc")
    ws = WeightStream(_Timed(dev, acc), ring, g.path, g.data_offset, dst, plan)
    with _timed_reads(acc):
        ws.load_base()
        acc.clear()
        rng, waits, nbytes, cpu = random.Random(seed), [], 0, 0.0
        for il in sorted(plan.experts):
            pick = rng.sample(range(plan.n_expert[il]), min(asked, plan.n_expert[il]))
            c, t = time.process_time(), time.perf_counter()
            ws.ensure(il, pick)
            waits.append(time.perf_counter() - t)
            cpu += time.process_time() - c
            nbytes += len(pick) * plan.expert_bytes(il)
        spent: dict = {}
        for mine in list(acc.values()):
            for k, v in mine.items():
                spent[k] = spent.get(k, 0.0) + v
        ws.wait_all()
        ws.join(10)
    per_layer = {k: round(v * 1000 / len(waits), 3) for k, v in sorted(spent.items())}
    per_layer["other"] = round(threads * sum(waits) * 1000 / len(waits) - sum(per_layer.values()), 3)
    ring.free(dev)
    reads = demand_reads(dev, g, plan, threads, asked, seed)
    s = ws.stats
    return {"threads": threads, "chunk_mb": chunk / MB, "buffers": buffers, "asked": asked, "layers": len(waits),
            "base_gb_s": s["base_gb_s"], "base_ms": s["base_upload_ms"], "demand_bytes": nbytes,
            "demand_ms": round(sum(waits) * 1000, 3), "demand_gb_s": gb_s(nbytes, sum(waits)),
            "layer_ms_p50": round(statistics.median(waits) * 1000, 3), "layer_ms_max": round(max(waits) * 1000, 3),
            # CPU seconds of the whole process per second of the bursts: the cores kept busy
            "burst_cpus": round(cpu / max(sum(waits), 1e-9), 2), "workers_ms_per_layer": per_layer,
            "all_resident_ms": s.get("all_resident_ms"), "reads_ms": round(reads * 1000, 3),
            "reads_gb_s": gb_s(nbytes, reads)}


def demand_reads(dev, g, plan, threads: int, asked: int, seed: int = 0) -> float:
    """Seconds to preadv the same experts as demand_rate (same seed), each layer's pieces (one per
    expert and stacked tensor) shared out among `threads` threads that wait for each other at the
    layer's end, into pinned buffers, no device copy: the page cache and Python's share of a burst."""
    import random

    rng = random.Random(seed)
    layers = []
    for il in sorted(plan.experts):
        pick = rng.sample(range(plan.n_expert[il]), min(asked, plan.n_expert[il]))
        layers.append([(g.data_offset + t.offset + e * t.stride, t.stride) for e in sorted(pick) for t in plan.experts[il]])
    biggest = max(n for pieces in layers for _, n in pieces)
    bufs = [dev.alloc_pinned(biggest) for _ in range(threads)]
    fd = os.open(g.path, os.O_RDONLY)
    start, end = threading.Barrier(threads + 1), threading.Barrier(threads + 1)
    todo: list = []

    def worker(w: int) -> None:
        while True:
            start.wait()
            if not todo:  # the main thread cleared it: done
                return
            for off, n in todo[0][w::threads]:
                read_chunk(fd, bufs[w][1], n, off, g.path)
            end.wait()

    ts = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(threads)]
    for t in ts:
        t.start()
    total = 0.0
    for pieces in layers:
        todo[:] = [pieces]
        t0 = time.perf_counter()
        start.wait()
        end.wait()
        total += time.perf_counter() - t0
    todo.clear()
    start.wait()
    for t in ts:
        t.join()
    os.close(fd)
    for ptr, _ in bufs:
        dev.free_pinned(ptr)
    return total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--threads", default="4,8,16")
    ap.add_argument("--chunks-mb", default="2,8")
    ap.add_argument("--buffers", default="2,4")
    ap.add_argument("--pin", default="alloc,thp", help="staging memory: alloc (cuMemHostAlloc), thp (huge pages + "
                                                       "cuMemHostRegister), comma-separated")
    ap.add_argument("--demand", type=int, default=0, metavar="N",
                    help="time experts on demand instead: N random experts of each MoE layer in turn")
    ap.add_argument("--pack", default="1", help="--demand: REFLEX_UPLOAD_PACK values to time (1: small experts "
                                                  "packed several to a copy, 0: one copy each), comma-separated")
    ap.add_argument("--copies", default="real", help="--demand: real, none (the same workers and reads with "
                                                      "no host-to-device copy or kernel: what is left is Python, "
                                                      "threads and the page cache) and/or noread (the copies "
                                                      "without the reads), comma-separated")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    if a.demand < 0:
        ap.error("--demand takes a positive number of experts per layer")
    if not {c for c in a.copies.split(",") if c} <= {"real", "none", "noread"} or not {p for p in a.pack.split(",") if p} <= {"0", "1"}:
        ap.error(f"--copies takes real, none and/or noread, --pack 1 and/or 0 (not {a.copies!r}, {a.pack!r})")
    if not {p for p in a.pin.split(",") if p} <= {"alloc", "thp"}:
        ap.error(f"--pin takes alloc and/or thp, not {a.pin!r}")
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    try:
        g = GGUFFile(a.model)
    except ReflexError as e:  # a missing or malformed file: one line
        print(f"bench_upload: {e}", file=sys.stderr)
        return 2
    if a.demand:
        from reflex_runtime.gpu.residency import plan_upload

        if plan_upload(g) is None:
            print(f"bench_upload: {os.path.basename(a.model)} has no routed experts: --demand needs a MoE file",
                  file=sys.stderr)
            return 2
    off, nbytes = g.data_offset, g.size - g.data_offset
    dev = _device()
    dst = dev.alloc(nbytes)
    if a.demand:
        return demand_main(a, dev, g, dst, ints)
    res = {"model": os.path.basename(a.model), "weights_bytes": nbytes, "cpus": os.cpu_count(),
           "warm_read_s": round(warm_page_cache(a.model), 3), "link": {}, "read": [], "upload": []}
    for s in (1, 4):
        res["link"][f"{s}_streams_gb_s"] = link_rate(dev, dst, s)
    pins = [p for p in a.pin.split(",") if p]
    res["pin_ms_per_mb"] = {p: pin_cost(dev, p) for p in pins}
    for th in ints(a.threads):
        for mb in ints(a.chunks_mb):
            res["read"].append({"threads": th, "chunk_mb": mb, "gb_s": read_rate(dev, a.model, off, nbytes, th, mb * MB)})
            for nb in ints(a.buffers):
                for pin in pins:
                    ring = StagingRing(dev, th, mb * MB, nb, pin=pin)
                    row = {"threads": th, "chunk_mb": mb, "buffers": nb, "pin": pin}
                    for k in ("first", "again"):
                        t = time.perf_counter()
                        upload_file_range(dev, ring, a.model, off, nbytes, dst)
                        row[f"{k}_gb_s"] = gb_s(nbytes, time.perf_counter() - t)
                    ring.free(dev)
                    res["upload"].append(row)
                    print(f"bench_upload: {row}", file=sys.stderr)
    print(f"{res['model']}: {nbytes / 1e9:.2f} GB of weights, {res['cpus']} CPUs; link "
          f"{res['link']['1_streams_gb_s']} GB/s on 1 stream, {res['link']['4_streams_gb_s']} on 4")
    print("pinning, ms per MB (256 MB as 8 MB buffers, one after another): "
          + ", ".join(f"{p} {v}" for p, v in res["pin_ms_per_mb"].items()))
    print(f"{'threads':>8}{'chunk MB':>10}{'read GB/s':>11}{'buffers':>9}{'pin':>6}{'first GB/s':>12}{'again GB/s':>12}")
    for r in res["upload"]:
        rd = next(x["gb_s"] for x in res["read"] if (x["threads"], x["chunk_mb"]) == (r["threads"], r["chunk_mb"]))
        print(f"{r['threads']:>8}{r['chunk_mb']:>10}{rd:>11}{r['buffers']:>9}{r['pin']:>6}{r['first_gb_s']:>12}"
              f"{r['again_gb_s']:>12}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


def demand_main(a, dev, g, dst: int, ints) -> int:
    res = {"model": os.path.basename(a.model), "weights_bytes": g.size - g.data_offset, "cpus": os.cpu_count(),
           "warm_read_s": round(warm_page_cache(a.model), 3), "demand": []}
    for copies in [c for c in a.copies.split(",") if c]:
        for pack in [p for p in a.pack.split(",") if p]:
            os.environ["REFLEX_UPLOAD_PACK"] = pack
            for th in ints(a.threads):
                for mb in ints(a.chunks_mb):
                    for nb in ints(a.buffers):
                        d = _NoCopies(dev) if copies == "none" else dev
                        with _no_reads(copies == "noread"):
                            row = {"copies": copies, "pack": pack, **demand_rate(d, g, dst, th, mb * MB, nb, a.demand)}
                        res["demand"].append(row)
                        print(f"bench_upload: {row}", file=sys.stderr)
    print(f"{res['model']}: {res['weights_bytes'] / 1e9:.2f} GB of weights, {res['cpus']} CPUs; "
          f"{a.demand} experts asked per MoE layer")
    cols = ("copies", "pack", "threads", "chunk_mb", "buffers", "base_gb_s", "demand_ms", "demand_gb_s", "layer_ms_p50", "layer_ms_max",
            "burst_cpus", "all_resident_ms", "reads_gb_s")
    print("".join(f"{c:>15}" for c in cols))
    for r in res["demand"]:
        print("".join(f"{r[c]!s:>15}" for c in cols))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
