#!/usr/bin/env python3
"""Warm request latency through `reflex serve` (HTTP) and `reflex uds` (unix socket), against the
engine's own time for the same request, to show what each transport adds.

One prompt of exactly 16 tokens (calibrated through the server's own token count) and 16 generated
tokens (greedy, ignore_eos). For every request: wall = client send -> full answer read; engine =
the record's `request_ms`; overhead = wall - engine. Reported as median and p95 over N requests,
as a table on stdout and as JSON with --out. Stream modes time until the last line / [DONE].

Note: the HTTP path tokenizes the prompt before Engine.generate starts its clock, the IPC path
inside it, so the HTTP overhead includes tokenizing 16 tokens (tens of microseconds).

On the CPU reference, OpenBLAS worker threads spin after each matmul and compete with the
response write on a small machine; OPENBLAS_NUM_THREADS=1 gives cleaner transport numbers there.

    OPENBLAS_NUM_THREADS=1 python scripts/bench_warm.py --backend cpu -n 3   # here (slow)
    python scripts/bench_warm.py -n 50 --out warm.json       # on the GPU machine (target: < 2 ms)
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from serve_client import WORDS, free_port, stop, wait_ready

PROMPT_TOKENS = 16
NEW_TOKENS = 16


def _cli(args: argparse.Namespace, *extra: str) -> list[str]:
    cmd = [sys.executable, "-m", "reflex_runtime.cli", *extra, "--backend", args.backend]
    return cmd + (["--model", args.model] if args.model else [])


def _stats(xs: list[float]) -> dict:
    s = sorted(xs)
    return {"median": round(statistics.median(s), 3), "p95": round(s[max(0, math.ceil(0.95 * len(s)) - 1)], 3),
            "min": round(s[0], 3), "max": round(s[-1], 3)}


# -- HTTP --------------------------------------------------------------------------------------


class Http:
    def __init__(self, args):
        self.port = free_port()
        self.proc = subprocess.Popen(_cli(args, "serve") + ["--port", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:  # 503: the model failed to load
            wait_ready(self.proc, self.port, "/healthz", args.load_timeout, "bench_warm: reflex serve", fatal=(503,))
        except SystemExit:
            stop(self.proc)
            raise
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=args.request_timeout)

    def request(self, prompt: str, max_tokens: int, stream: bool) -> tuple[float, dict]:
        body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                           "stream": stream})
        t0 = time.perf_counter()
        self.conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        r = self.conn.getresponse()
        data = r.read()
        wall = time.perf_counter() - t0
        if r.status != 200:
            raise SystemExit(f"bench_warm: HTTP {r.status}: {data[:300]!r}")
        if not stream:
            return wall, json.loads(data)["reflex"]
        events = [e[6:] for e in data.decode().split("\n\n") if e.startswith("data: ")]
        assert events[-1] == "[DONE]"
        return wall, next(json.loads(e)["reflex"] for e in reversed(events[:-1]) if "reflex" in json.loads(e))

    def close(self):
        self.conn.close()
        stop(self.proc)


# -- unix socket ---------------------------------------------------------------------------------


class Uds:
    def __init__(self, args):
        self.dir = tempfile.mkdtemp(prefix="reflex-bench-", dir="/tmp")
        path = os.path.join(self.dir, "s.sock")
        self.proc = subprocess.Popen(_cli(args, "uds", path), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)
        ready = json.loads(self.proc.stdout.readline() or b'{"error": "exited"}')
        if ready.get("op") != "ready":
            raise SystemExit(f"bench_warm: reflex uds did not start: {ready}")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(args.request_timeout)
        self.sock.connect(path)
        self.rfile = self.sock.makefile("rb")
        json.loads(self.rfile.readline())  # this connection's ready line
        self.n = 0

    def request(self, prompt: str, max_tokens: int, stream: bool) -> tuple[float, dict]:
        self.n += 1
        line = json.dumps({"id": self.n, "op": "generate", "prompt": prompt, "max_tokens": max_tokens,
                           "ignore_eos": True, "stream": stream}).encode() + b"\n"
        t0 = time.perf_counter()
        self.sock.sendall(line)
        while True:
            msg = json.loads(self.rfile.readline())
            if "delta" not in msg:
                break
        wall = time.perf_counter() - t0
        if "error" in msg:
            raise SystemExit(f"bench_warm: uds error: {msg['error']}")
        return wall, msg["record"]

    def close(self):
        try:
            self.sock.sendall(b'{"id": 0, "op": "shutdown"}\n')
            self.rfile.readline()
        except OSError:
            pass
        self.rfile.close()
        self.sock.close()
        self.proc.wait(10)
        os.rmdir(self.dir) if not os.listdir(self.dir) else None


# -- the run ------------------------------------------------------------------------------------------


def calibrate(client) -> str:
    """Words until the server counts exactly PROMPT_TOKENS prompt tokens (BOS included)."""
    n = PROMPT_TOKENS - 1
    for _ in range(40):
        prompt = " ".join(WORDS[i % len(WORDS)] for i in range(n))
        got = client.request(prompt, 1, False)[1]["prompt_tokens"]
        if got == PROMPT_TOKENS:
            return prompt
        n += 1 if got < PROMPT_TOKENS else -1
        if n < 1:
            break
    # Words did not land on 16 exactly (multi-token words): accept the nearest and say so.
    print(f"bench_warm: prompt is {got} tokens, not {PROMPT_TOKENS}", file=sys.stderr)
    return prompt


def measure(client, prompt: str, stream: bool, n: int, warmup: int) -> dict:
    for _ in range(warmup):
        client.request(prompt, NEW_TOKENS, stream)
    walls, engines, overheads = [], [], []
    rec = {}
    for _ in range(n):
        wall, rec = client.request(prompt, NEW_TOKENS, stream)
        walls.append(wall * 1000)
        engines.append(rec["request_ms"])
        overheads.append(wall * 1000 - rec["request_ms"])
    return {"n": n, "wall_ms": _stats(walls), "engine_ms": _stats(engines), "overhead_ms": _stats(overheads),
            "prompt_tokens": rec.get("prompt_tokens"), "generated_tokens": rec.get("generated_tokens"),
            "backend": rec.get("backend"), "device": rec.get("device")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="GGUF path or hub ref (default: the embedded model)")
    ap.add_argument("--backend", default="auto", choices=("auto", "cuda", "cpu"))
    ap.add_argument("-n", type=int, default=50, help="measured requests per mode")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--transports", default="http,uds")
    ap.add_argument("--no-stream", action="store_true", help="skip the streaming modes")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--load-timeout", type=float, default=300)
    ap.add_argument("--request-timeout", type=float, default=600)
    args = ap.parse_args(argv)

    results = []
    for name in args.transports.split(","):
        client = {"http": Http, "uds": Uds}[name](args)
        try:
            prompt = calibrate(client)
            for stream in (False,) if args.no_stream else (False, True):
                r = measure(client, prompt, stream, args.n, args.warmup)
                results.append({"transport": name, "mode": "stream" if stream else "whole", **r})
                print(f"bench_warm: {name} {'stream' if stream else 'whole'} done", file=sys.stderr)
        finally:
            client.close()

    head = f"{'transport':<9} {'mode':<6} {'n':>4} {'wall med':>10} {'engine med':>11} {'overhead med':>13} {'overhead p95':>13}"
    print(head)
    for r in results:
        print(f"{r['transport']:<9} {r['mode']:<6} {r['n']:>4} {r['wall_ms']['median']:>10.3f} {r['engine_ms']['median']:>11.3f} "
              f"{r['overhead_ms']['median']:>13.3f} {r['overhead_ms']['p95']:>13.3f}")
    out = {"prompt_tokens": PROMPT_TOKENS, "new_tokens": NEW_TOKENS, "backend": args.backend, "model": args.model,
           "unit": "ms", "results": results}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
