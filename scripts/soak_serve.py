#!/usr/bin/env python3
"""Soak `reflex serve` (a benchmark, not a test): many concurrent clients for minutes, with slow
clients, disconnects and oversized or hostile requests mixed in. It reports:

- lost replies (a request that should have been answered was not: reset, timeout, cut short) and
  mixed replies (an answer that is not the answer to that request: wrong status, a token count
  that does not match the prompt sent, candidates that are not the ones sent or scores that are
  not the first answer's to the same system1 request, two response ids in one stream, a reused
  id). Both must be 0.
- latency of a small request (one generated token) sent by a probe client PROBE_EVERY seconds
  after its previous answer, split by which hostile requests (oversized, slow sender, slow reader,
  long generation) were in flight when it was sent: p50 / p99 / max. Every request reaches the one engine
  thread through a FIFO queue, so these include waiting behind the other clients' requests. For
  scale, the probe first runs alone on the idle server for --baseline seconds.
- the server's RSS every RSS_EVERY seconds (and its thread count): flat means no leak.

The server runs the CPU backend (--backend) on a tiny model (default: the random Gemma 3 test fixture, 14 MB,
512-token vocabulary, built with scripts/make_fixtures.py) so the engine is fast enough for the
transport to be what is stressed. The expected prompt token counts come from the same GGUF's
tokenizer, loaded here.

    python scripts/soak_serve.py --duration 300 --clients 50 --out results/2026-11-30-cpu/soak_serve.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from serve_client import WORDS, free_port, get, stop, wait_ready

ROOT = Path(__file__).resolve().parents[1]
KEY = "soak-key"
AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
PROBE_EVERY = 0.5
RSS_EVERY = 5.0
CLIENT_TIMEOUT = 180.0
# behaviour -> weight (of every client's requests)
MIX = {"small": 35, "system1": 15, "stream": 10, "slow_sender": 5, "slow_reader": 5, "disconnect": 10,
       "oversized": 12, "long": 2, "no_key": 3}
HOSTILE = {"slow_sender", "slow_reader", "oversized", "long"}
SYSTEM1_SET = 12  # distinct system1 requests, each asked many times
SYSTEM1_TOL = 1e-4  # token log-probabilities of the same request (answers round them to 1e-6)


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.sent = Counter()
        self.answered = Counter()
        self.lost: list[str] = []
        self.mixed: list[str] = []
        self.statuses = Counter()
        self.latency: dict[str, list[float]] = {}
        self.hostile_in_flight = 0
        self.in_flight = Counter()  # hostile kind -> requests of it in flight
        self.ids: set[str] = set()
        self.system1: dict[int, list[float]] = {}  # request -> its first answer's token log-probabilities

    def add_latency(self, kind: str, s: float) -> None:
        with self.lock:
            self.latency.setdefault(kind, []).append(s)

    def lose(self, kind: str, why: str) -> None:
        with self.lock:
            self.lost.append(f"{kind}: {why}")

    def mix(self, kind: str, why: str) -> None:
        with self.lock:
            self.mixed.append(f"{kind}: {why}")

    def new_id(self, kind: str, rid: str) -> None:
        with self.lock:
            if rid in self.ids:
                self.mixed.append(f"{kind}: response id {rid} seen twice")
            self.ids.add(rid)


class Soak:
    def __init__(self, port: int, tokenizer, tally: Tally, seed: int):
        self.port, self.tok, self.t = port, tokenizer, tally
        self.rng = random.Random(seed)

    # -- helpers -----------------------------------------------------------------------------

    def prompt(self) -> tuple[str, int]:
        words = [self.rng.choice(WORDS) + str(self.rng.randint(0, 99)) for _ in range(self.rng.randint(1, 40))]
        text = " ".join(words)
        return text, len(self.tok.encode(text, add_special=True, parse_special=True))

    def request(self, method: str, path: str, body: bytes | None, headers=AUTH):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=CLIENT_TIMEOUT)
        try:
            c.request(method, path, body=body, headers=headers)
            r = c.getresponse()
            return r.status, r.getheader("Content-Type"), r.read()
        finally:
            c.close()

    def check_completion(self, kind: str, status: int, data: bytes, want_prompt: int, max_tokens: int) -> None:
        if status != 200:
            return self.t.mix(kind, f"status {status}: {data[:200]!r}")
        b = json.loads(data)
        self.t.new_id(kind, b["id"])
        u = b["usage"]
        if u["prompt_tokens"] != want_prompt:
            self.t.mix(kind, f"prompt_tokens {u['prompt_tokens']} for a prompt of {want_prompt}")
        if not 1 <= u["completion_tokens"] <= max_tokens:
            self.t.mix(kind, f"completion_tokens {u['completion_tokens']} (max_tokens {max_tokens})")

    def check_stream(self, kind: str, status: int, data: bytes, want_prompt: int) -> None:
        if status != 200:
            return self.t.mix(kind, f"status {status}")
        events = [e for e in data.decode().split("\n\n") if e]
        if not events or events[-1] != "data: [DONE]":
            return self.t.lose(kind, "stream did not end with [DONE]")
        chunks = [json.loads(e[6:]) for e in events[:-1]]
        ids = {c["id"] for c in chunks}
        if len(ids) != 1:
            return self.t.mix(kind, f"{len(ids)} response ids in one stream")
        self.t.new_id(kind, ids.pop())
        usage = chunks[-1].get("usage") or {}
        if usage.get("prompt_tokens") != want_prompt:
            self.t.mix(kind, f"stream usage {usage} for a prompt of {want_prompt}")

    # -- behaviours ----------------------------------------------------------------------------

    def small(self, max_tokens: int = 4, kind: str = "small") -> None:
        text, n = self.prompt()
        body = json.dumps({"prompt": text, "max_tokens": max_tokens, "temperature": 0}).encode()
        t0 = time.perf_counter()
        status, _, data = self.request("POST", "/v1/completions", body)
        self.t.add_latency(kind, time.perf_counter() - t0)
        self.check_completion(kind, status, data, n, max_tokens)

    def system1(self) -> None:
        """One of SYSTEM1_SET fixed requests: its candidates, and its scores the same as the first
        answer to it (whatever else shared its steps: a tree is its own forward pass)."""
        key = self.rng.randrange(SYSTEM1_SET)
        r = random.Random(key)
        cands = [" " + r.choice(WORDS) + str(r.randint(0, 9999)) for _ in range(r.randint(1, 4))]
        prompt = " ".join(r.choice(WORDS) + str(r.randint(0, 99)) for _ in range(r.randint(1, 40)))
        body = json.dumps({"prompt": prompt, "candidates": cands}).encode()
        status, _, data = self.request("POST", "/v1/system1", body)
        if status != 200:
            return self.t.mix("system1", f"status {status}")
        got = json.loads(data)["candidates"]
        if [c["text"] for c in got] != cands:
            return self.t.mix("system1", f"candidates {[c['text'] for c in got]} for {cands}")
        lps = [lp for c in got for lp in c["token_logprobs"]]
        with self.t.lock:
            first = self.t.system1.setdefault(key, lps)
        if len(first) != len(lps) or max(abs(a - b) for a, b in zip(first, lps)) > SYSTEM1_TOL:
            self.t.mix("system1", f"request {key}: scores {lps} after {first}")

    def stream(self) -> None:
        text, n = self.prompt()
        body = json.dumps({"prompt": text, "max_tokens": 8, "stream": True,
                           "stream_options": {"include_usage": True}}).encode()
        status, _, data = self.request("POST", "/v1/completions", body)
        self.check_stream("stream", status, data, n)

    def _raw(self, payload_parts, pause: float = 0.0, read_chunk: int = 0, read_pause: float = 0.0) -> bytes:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=CLIENT_TIMEOUT)
        try:
            for i, part in enumerate(payload_parts):
                if i and pause:
                    time.sleep(pause)
                s.sendall(part)
            got = b""
            while True:
                chunk = s.recv(read_chunk or 65536)
                if not chunk:
                    return got
                got += chunk
                if read_pause:
                    time.sleep(read_pause)
        finally:
            s.close()

    @staticmethod
    def _head(path: str, length: int, extra: str = "") -> bytes:
        return (f"POST {path} HTTP/1.1\r\nHost: soak\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {length}\r\nConnection: close\r\n{extra}\r\n").encode()

    @staticmethod
    def _split_reply(raw: bytes) -> tuple[int, dict, bytes]:
        head, _, body = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        if headers.get("transfer-encoding") == "chunked":
            out, rest = b"", body
            while rest:
                size, _, rest = rest.partition(b"\r\n")
                n = int(size, 16)
                if n == 0:
                    break
                out, rest = out + rest[:n], rest[n + 2:]
            body = out
        return int(lines[0].split()[1]), headers, body

    def slow_sender(self) -> None:
        text, n = self.prompt()
        body = json.dumps({"prompt": text, "max_tokens": 4, "temperature": 0}).encode()
        q = max(1, len(body) // 4)
        parts = [self._head("/v1/completions", len(body))] + [body[i:i + q] for i in range(0, len(body), q)]
        raw = self._raw(parts, pause=0.5)
        if not raw:
            return self.t.lose("slow_sender", "no reply")
        status, _, data = self._split_reply(raw)
        self.check_completion("slow_sender", status, data, n, 4)

    def slow_reader(self) -> None:
        text, n = self.prompt()
        body = json.dumps({"prompt": text, "max_tokens": 32, "stream": True, "ignore_eos": True,
                           "stream_options": {"include_usage": True}}).encode()
        raw = self._raw([self._head("/v1/completions", len(body)) + body], read_chunk=256, read_pause=0.05)
        if not raw:
            return self.t.lose("slow_reader", "no reply")
        status, _, data = self._split_reply(raw)
        self.check_stream("slow_reader", status, data, n)

    def disconnect(self) -> None:
        how = self.rng.choice(("connect_close", "half_headers", "mid_stream"))
        s = socket.create_connection(("127.0.0.1", self.port), timeout=CLIENT_TIMEOUT)
        try:
            if how == "half_headers":
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: soak\r\nContent-Le")
            elif how == "mid_stream":
                body = json.dumps({"prompt": self.prompt()[0], "max_tokens": 64, "stream": True,
                                   "ignore_eos": True}).encode()
                s.sendall(self._head("/v1/completions", len(body)) + body)
                s.recv(1024)  # the headers and maybe a chunk, then gone
        finally:
            s.close()

    def oversized(self) -> None:
        how = self.rng.choice(("body_over_limit", "prompt_over_chars", "nested", "huge_max_tokens", "bad_length"))
        if how == "body_over_limit":  # declared 5 MB; the server answers 413 without waiting for it
            raw = self._raw([self._head("/v1/completions", 5 * 1024 * 1024) + b"{" + b" " * 65535])
            want = 413
        elif how == "bad_length":
            raw = self._raw([self._head("/v1/completions", 0).replace(b"Content-Length: 0", "Content-Length: ²".encode())])
            want = 400
        else:
            body = {"prompt_over_chars": lambda: json.dumps({"prompt": "x " * 100_000}).encode(),
                    "nested": lambda: b"[" * 100_000 + b"]" * 100_000,
                    "huge_max_tokens": lambda: json.dumps({"prompt": "hi", "max_tokens": 100_000}).encode()}[how]()
            raw = self._raw([self._head("/v1/completions", len(body)) + body])
            want = 400
        if not raw:
            return self.t.lose("oversized", f"{how}: no reply")
        status, _, data = self._split_reply(raw)
        if status != want or "error" not in json.loads(data):
            self.t.mix("oversized", f"{how}: status {status}, wanted {want}")

    def long(self) -> None:
        text, n = self.prompt()
        body = json.dumps({"prompt": text, "max_tokens": 400, "ignore_eos": True, "temperature": 0}).encode()
        status, _, data = self.request("POST", "/v1/completions", body)
        self.check_completion("long", status, data, n, 400)

    def no_key(self) -> None:
        status, _, _ = self.request("POST", "/v1/completions", b'{"prompt": "hi"}',
                                    headers={"Authorization": "Bearer wrong"})
        if status != 401:
            self.t.mix("no_key", f"status {status}")

    # -- one client ----------------------------------------------------------------------------

    def run(self, deadline: float, think: float) -> None:
        kinds, weights = zip(*MIX.items())
        time.sleep(self.rng.uniform(0, think))  # clients start spread out, not in one burst
        while time.monotonic() < deadline:
            kind = self.rng.choices(kinds, weights)[0]
            hostile = kind in HOSTILE
            with self.t.lock:
                self.t.sent[kind] += 1
                self.t.hostile_in_flight += hostile
                self.t.in_flight[kind] += hostile
            try:
                getattr(self, kind)()
                with self.t.lock:
                    self.t.answered[kind] += 1
            except Exception as e:  # noqa: BLE001 - every failure is counted
                if kind != "disconnect":
                    self.t.lose(kind, f"{type(e).__name__}: {e}")
            finally:
                with self.t.lock:
                    self.t.hostile_in_flight -= hostile
                    self.t.in_flight[kind] -= hostile
            time.sleep(min(self.rng.expovariate(1 / think), max(0.0, deadline - time.monotonic())) if think else 0)


def probe(port: int, tokenizer, tally: Tally, deadline: float, samples: list) -> None:
    s = Soak(port, tokenizer, tally, seed=10_000)
    while time.monotonic() < deadline:
        with tally.lock:
            hostile = frozenset(k for k, n in tally.in_flight.items() if n > 0)
        t0 = time.perf_counter()
        try:
            s.small(max_tokens=1, kind="probe")
            samples.append((time.perf_counter() - t0, hostile))
        except Exception as e:  # noqa: BLE001
            tally.lose("probe", f"{type(e).__name__}: {e}")
        time.sleep(PROBE_EVERY)


def rss_sampler(pid: int, t_start: float, deadline: float, out: list) -> None:
    while time.monotonic() < deadline + RSS_EVERY:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return
        fields = dict(ln.split(":", 1) for ln in status.splitlines() if ":" in ln)
        out.append({"t_s": round(time.monotonic() - t_start, 1), "rss_mb": round(int(fields["VmRSS"].split()[0]) / 1024, 1),
                    "threads": int(fields["Threads"])})
        time.sleep(RSS_EVERY)


def _q(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(q * len(s)))] * 1000, 1)


def _lat(xs: list[float]) -> dict:
    return {"n": len(xs), "p50_ms": _q(xs, 0.5), "p99_ms": _q(xs, 0.99), "max_ms": _q(xs, 1.0)}


def _slope_mb_per_min(series: list[dict]) -> float | None:
    pts = [(p["t_s"], p["rss_mb"]) for p in series]
    pts = pts[len(pts) // 2:]  # the second half: after warm-up
    if len(pts) < 3:
        return None
    mt, mr = statistics.fmean(t for t, _ in pts), statistics.fmean(r for _, r in pts)
    var = sum((t - mt) ** 2 for t, _ in pts)
    return round(sum((t - mt) * (r - mr) for t, r in pts) / var * 60, 3) if var else None


def default_model() -> str:
    sys.path.insert(0, str(ROOT / "scripts"))
    from fixtures import make_fixture

    return str(make_fixture("gemma3", "f32").gguf)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="GGUF to serve (default: the tiny random Gemma 3 test fixture)")
    ap.add_argument("--duration", type=float, default=300.0)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--baseline", type=float, default=20.0, help="seconds of the probe alone first")
    ap.add_argument("--think", type=float, default=10.0,
                    help="mean seconds a client waits between its requests (exponential; 0: back to back, which "
                         "saturates the one engine and turns every latency into queueing)")
    ap.add_argument("--backend", default="cpu", help="the server's backend (cuda on a GPU machine)")
    ap.add_argument("--parallel", type=int, default=0, help="the server's --parallel (0: its default)")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    ap.add_argument("--log", type=Path, help="the server's stderr (default: /tmp/soak-serve-PORT.log)")
    args = ap.parse_args(argv)

    sys.path.insert(0, str(ROOT))
    from reflex_runtime.modelfile.gguf_file import GGUFFile
    from reflex_runtime.text.tokenizer import Tokenizer

    model = args.model or default_model()
    tokenizer = Tokenizer.from_gguf(GGUFFile(model)).prepare()
    port = args.port or free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "reflex_runtime.cli", "serve", "--backend", args.backend, "--model", model,
           "--port", str(port), "--api-key", KEY] + (["--parallel", str(args.parallel)] if args.parallel else [])
    log_path = args.log or Path(f"/tmp/soak-serve-{port}.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "w")
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        wait_ready(server, port, "/healthz", 300, "soak_serve: reflex serve")
        baseline = []
        probe(port, tokenizer, Tally(), time.monotonic() + args.baseline, baseline)
        tally, samples, rss = Tally(), [], []
        t_start = time.monotonic()
        deadline = t_start + args.duration
        threads = [threading.Thread(target=Soak(port, tokenizer, tally, seed=i).run, args=(deadline, args.think),
                                    daemon=True) for i in range(args.clients)]
        threads.append(threading.Thread(target=probe, args=(port, tokenizer, tally, deadline, samples), daemon=True))
        threads.append(threading.Thread(target=rss_sampler, args=(server.pid, t_start, deadline, rss), daemon=True))
        for t in threads:
            t.start()
        for t in threads:
            t.join(args.duration + CLIENT_TIMEOUT + 60)
        alive = sum(t.is_alive() for t in threads)
        still_up = server.poll() is None
        health = get(port, "/healthz") if still_up else None
    finally:
        stop(server)
        log.close()

    hostile = [s for s, h in samples if h]
    calm = [s for s, h in samples if not h]
    res = {
        "date": time.strftime("%Y-%m-%d"), "command": " ".join([Path(sys.executable).name] + sys.argv),
        "server_command": " ".join(cmd[1:]), "server_log": str(log_path), "model": model, "duration_s": args.duration, "clients": args.clients,
        "think_s_mean": args.think, "mix": MIX,
        "machine": {"cpus": os.cpu_count(), "note": "shared development VM; the clients run on the same cores"},
        "requests_sent": dict(tally.sent), "requests_answered": dict(tally.answered),
        "requests_total": sum(tally.sent.values()),
        "lost_replies": len(tally.lost), "mixed_replies": len(tally.mixed),
        "lost_examples": tally.lost[:20], "mixed_examples": tally.mixed[:20],
        "client_threads_still_running": alive, "server_alive_at_end": still_up, "healthz_at_end": health,
        "probe_small_request_latency": {
            "hostile_in_flight": _lat(hostile), "no_hostile_in_flight": _lat(calm),
            "long_generation_in_flight": _lat([s for s, h in samples if "long" in h]),
            "hostile_but_no_long_generation_in_flight": _lat([s for s, h in samples if h and "long" not in h]),
            "oversized_in_flight": _lat([s for s, h in samples if "oversized" in h]),
            "idle_server_baseline": _lat([s for s, _ in baseline])},
        "latency_by_kind": {k: _lat(v) for k, v in sorted(tally.latency.items())},
        "rss_mb": {"first": rss[0]["rss_mb"] if rss else None, "last": rss[-1]["rss_mb"] if rss else None,
                   "max": max((p["rss_mb"] for p in rss), default=None),
                   "slope_second_half_mb_per_min": _slope_mb_per_min(rss)},
        "threads_max": max((p["threads"] for p in rss), default=None),
        "rss_series": rss,
    }
    text = json.dumps(res, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    summary = {k: res[k] for k in ("requests_total", "lost_replies", "mixed_replies", "server_alive_at_end",
                                   "probe_small_request_latency", "rss_mb", "threads_max")}
    print(json.dumps(summary, indent=1))
    return 0 if res["lost_replies"] == 0 and res["mixed_replies"] == 0 and still_up else 1


if __name__ == "__main__":
    sys.exit(main())
