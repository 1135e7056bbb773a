#!/usr/bin/env python3
"""Concurrency benchmark of an OpenAI-compatible server (issue 32; a benchmark, not a test): N
concurrent clients (--clients 1,4,16,64) against `reflex serve` and llama-server, each spawned
here on 127.0.0.1, run level by level, then stopped.

Every client sends --requests-per-client streaming /v1/completions in a row: a prompt of exactly
--prompt-tokens tokens (counted by the server itself; every request's words in another order, so
that no server is helped by a prefix cache) and --answer-tokens tokens, greedy, ignore_eos. An answer
of another length, a prompt the server counted otherwise, an error or a timeout is a failure.
Per level: aggregate generated tok/s (tokens / the level's wall time), time to first token
(request sent -> first SSE chunk with text), inter-token latency (gaps between text chunks, all
requests pooled), request latency, and joules per token from NVML's energy counter read here,
outside the servers (null without NVML). With --runs N each level runs N times and the figures are
the medians of the runs.

    python scripts/bench_serve.py --model qwen3-0.6b-q8_0.gguf --llama-server /tmp/peers/llama.cpp/llama-server \
        --runs 3 --out serve.json --compare-out compare.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from compare_json import row as compare_row, write_compare
from serve_client import WORDS, free_port, stop, wait_ready

ROOT = Path(__file__).resolve().parents[1]
HEAD = "A:"  # every prompt starts with it, so every shuffled word has its leading space (same count)
FILLERS = list("bcdefghijklmnopqrstuvwxyz")
FIELDS = ("tok_s", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "latency_p50_s", "joules", "joules_per_token")


def pct(xs: list[float], q: float) -> float | None:
    """Nearest-rank percentile."""
    if not xs:
        return None
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def r6(x):
    return None if x is None else round(x, 6)


# -- servers -----------------------------------------------------------------------------------


class Target:
    """One server: spawned, waited for, asked. extra: fields the streaming requests add."""

    def __init__(self, name: str, cmd: list[str], health: str, port: int, extra: dict, env: dict, log: Path):
        self.name, self.cmd, self.health, self.port, self.extra, self.env, self.log = name, cmd, health, port, extra, env, log
        self.proc = None

    def start(self, timeout: float) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=self.env)
        wait_ready(self.proc, self.port, self.health, timeout, f"bench_serve: {self.name}")

    def body(self, prompt: str, max_tokens: int, stream: bool) -> bytes:
        return json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                           "stream": stream, **(self.extra if stream else {})}).encode()

    def prompt_tokens(self, prompt: str, timeout: float) -> int:
        """The server's own count: usage of a one-token completion."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request("POST", "/v1/completions", self.body(prompt, 1, False), {"Content-Type": "application/json"})
            r = c.getresponse()
            data = r.read()
        finally:
            c.close()
        if r.status != 200:
            raise SystemExit(f"bench_serve: {self.name} answered {r.status}: {data[:300]!r}")
        return json.loads(data)["usage"]["prompt_tokens"]


def reflex_target(args, port: int) -> Target:
    cmd = [sys.executable, "-m", "reflex_runtime.cli", "serve", "--model", args.model, "--port", str(port),
           "--backend", args.backend]
    help_text = subprocess.run(cmd[:4] + ["--help"], capture_output=True, text=True, env=_env()).stdout
    if "--parallel" in help_text:  # a server that batches concurrent requests: as many as the most clients
        cmd += ["--parallel", str(args.parallel or max(args.clients))]
    # include_usage: the last chunk says how many tokens were generated (text chunks may merge tokens)
    return Target("reflex", cmd, "/healthz", port, {"stream_options": {"include_usage": True}}, _env(),
                  args.log_dir / "reflex-serve.log")


def llama_target(args, port: int) -> Target:
    np_ = max(args.clients)
    ctx = np_ * (args.prompt_tokens + args.answer_tokens + 16)  # each of np slots gets ctx / np tokens
    cmd = [args.llama_server, "-m", args.model, "-ngl", "99", "-np", str(np_), "-c", str(ctx), "--port", str(port),
           "--host", "127.0.0.1"]
    env = _env()
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(Path(args.llama_server).parent), env.get("LD_LIBRARY_PATH")) if p)
    return Target("llama", cmd, "/health", port, {}, env, args.log_dir / "llama-server.log")


def _env() -> dict:
    pp = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + pp if pp else "")}


# -- prompts -----------------------------------------------------------------------------------


def words_for(n: int, k: int) -> list[str]:
    """n of WORDS, then k one-letter words (one token each in the tokenizers we meet) to land exactly."""
    return [WORDS[i % len(WORDS)] for i in range(n)] + [FILLERS[i % len(FILLERS)] for i in range(k)]


def calibrate(t: Target, want: int, timeout: float) -> tuple[int, int]:
    """(n, k) such that HEAD + any order of words_for(n, k) is `want` tokens as the server counts
    them: words do not merge across spaces, so the count does not depend on their order."""
    count = lambda n, k: t.prompt_tokens(" ".join([HEAD] + words_for(n, k)), timeout)
    lo, got = 0, count(0, 0)
    if got > want:
        raise SystemExit(f"bench_serve: {t.name}: the prompt's head alone is {got} tokens, more than {want}")
    hi = None  # the fewest words known to be too many
    while hi is None or hi - lo > 1:  # the most whole words that fit: step up by estimate, then bisect
        n = (lo + hi) // 2 if hi is not None else lo + max(1, (want - got) // 3)
        c = count(n, 0)
        if c <= want:
            lo, got = n, c
        else:
            hi = n
        if got == want:
            return lo, 0
    for k in range(want - got, 0, -1):  # a filler may be two tokens somewhere: fewer then
        if count(lo, k) == want:
            return lo, k
    raise SystemExit(f"bench_serve: {t.name}: no prompt of exactly {want} tokens")


def prompt(shape: tuple[int, int], seed: tuple) -> str:
    w = words_for(*shape)
    random.Random(repr(seed)).shuffle(w)
    return " ".join([HEAD] + w)


# -- one streaming request -------------------------------------------------------------------


def stream_request(t: Target, text: str, args, deadline: float) -> dict:
    out = {"ok": False, "tokens": 0, "ttft": None, "gaps": [], "latency": None, "error": None}
    chunks, usage, last = 0, None, None
    c = http.client.HTTPConnection("127.0.0.1", t.port, timeout=max(0.01, deadline - time.monotonic()))
    t0 = time.perf_counter()
    try:
        c.request("POST", "/v1/completions", t.body(text, args.answer_tokens, True), {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            out["error"] = f"HTTP {r.status}: {r.read()[:200]!r}"
            return out
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                out["error"] = "timeout"
                return out
            c.sock.settimeout(left)  # each read bounded by what is left of the request's time
            line = r.readline()
            if not line:
                break
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                break
            ev = json.loads(data)
            if "error" in ev:
                out["error"] = f"stream error: {str(ev['error'])[:200]}"
                return out
            now = time.perf_counter()
            if any(ch.get("text") for ch in ev.get("choices") or ()):
                chunks += 1
                if last is None:
                    out["ttft"] = now - t0
                else:
                    out["gaps"].append(now - last)
                last = now
            usage = ev.get("usage") or usage
    except (OSError, http.client.HTTPException, ValueError) as e:
        out["error"] = f"{type(e).__name__}: {e}"
        return out
    finally:
        c.close()
    out["latency"] = time.perf_counter() - t0
    out["tokens"] = usage["completion_tokens"] if usage else chunks
    if out["tokens"] != args.answer_tokens:
        out["error"] = f"{out['tokens']} tokens, not {args.answer_tokens}"
    elif usage and usage.get("prompt_tokens") not in (None, args.prompt_tokens):
        out["error"] = f"prompt counted as {usage['prompt_tokens']} tokens, not {args.prompt_tokens}"
    else:
        out["ok"] = True
    return out


# -- a level -----------------------------------------------------------------------------------


class Energy:
    """NVML's total energy counter (mJ) of one GPU, read in this process; None without NVML."""

    def __init__(self, index: int):
        self.h, self.note, self.gpu, self._nvml = None, None, None, None
        try:
            import pynvml  # optional: nvidia-ml-py

            pynvml.nvmlInit()
            self._nvml, self.h = pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(self.h)
            self.gpu = name.decode() if isinstance(name, bytes) else name
            self.mj()  # a GPU without the counter (before Volta) fails here
        except Exception as e:  # noqa: BLE001 - no pynvml, no driver, no such device: no energy
            self.h, self.note = None, f"no NVML energy reading ({type(e).__name__}: {e})"

    def mj(self) -> int | None:
        return self._nvml.nvmlDeviceGetTotalEnergyConsumption(self.h) if self.h is not None else None


def run_level(t: Target, clients: int, shape: tuple, level_seed: int, args, energy: Energy) -> dict:
    prompts = [[prompt(shape, (level_seed, clients, i, k)) for k in range(args.requests_per_client)]
               for i in range(clients)]
    results: list[dict] = []
    lock, go = threading.Lock(), threading.Event()
    ends = [0.0] * clients
    level_deadline = [0.0]

    def client(i: int) -> None:
        go.wait()
        for text in prompts[i]:
            now = time.monotonic()
            if now >= level_deadline[0]:
                res = {"ok": False, "tokens": 0, "ttft": None, "gaps": [], "latency": None, "error": "level timeout"}
            else:
                res = stream_request(t, text, args, min(now + args.timeout, level_deadline[0]))
            with lock:
                results.append(res)
        ends[i] = time.perf_counter()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for th in threads:
        th.start()
    e0 = energy.mj()
    t0 = time.perf_counter()
    level_deadline[0] = time.monotonic() + args.timeout
    go.set()
    for th in threads:
        th.join(max(0.0, level_deadline[0] - time.monotonic()) + 5)
    stuck = sum(th.is_alive() for th in threads)  # past the level's time (a read in flight): counted as lost
    wall = (max(ends) if not stuck else time.perf_counter()) - t0
    e1 = energy.mj()
    with lock:
        done = list(results)
    failed = [r for r in done if not r["ok"]]
    tokens = sum(r["tokens"] for r in done if r["ok"])
    joules = (e1 - e0) / 1000 if e0 is not None else None
    ttft, gaps = [r["ttft"] for r in done if r["ttft"] is not None], [g for r in done for g in r["gaps"]]
    return {"clients": clients, "requests": clients * args.requests_per_client, "tokens": tokens,
            "wall_s": r6(wall), "tok_s": round(tokens / wall, 2) if wall > 0 else None,
            "ttft_p50_s": r6(pct(ttft, 0.5)), "ttft_p99_s": r6(pct(ttft, 0.99)),
            "itl_p50_s": r6(pct(gaps, 0.5)), "itl_p99_s": r6(pct(gaps, 0.99)),
            "latency_p50_s": r6(pct([r["latency"] for r in done if r["ok"]], 0.5)),
            "failures": len(failed) + clients * args.requests_per_client - len(done),
            "failure_examples": sorted({r["error"] for r in failed})[:5],
            "joules": r6(joules), "joules_per_token": r6(joules / tokens) if joules is not None and tokens else None}


def run_target(t: Target, args, energy: Energy) -> dict:
    print(f"bench_serve: {t.name}: {' '.join(t.cmd)}", file=sys.stderr)
    try:
        t.start(args.load_timeout)
        shape = calibrate(t, args.prompt_tokens, args.timeout)  # these requests also warm the server up
        levels = []
        for c in args.clients:
            runs = [run_level(t, c, shape, k, args, energy) for k in range(args.runs)]
            level = dict(runs[0])
            if args.runs > 1:  # medians of the runs; failures summed
                level.update({f: (r6(statistics.median(v)) if None not in (v := [r[f] for r in runs]) else None)
                              for f in FIELDS + ("wall_s",)})
                level.update(requests=sum(r["requests"] for r in runs), tokens=sum(r["tokens"] for r in runs),
                             failures=sum(r["failures"] for r in runs), runs=runs)
            levels.append(level)
            print(f"bench_serve: {t.name} c={c}: {level['tok_s']} tok/s, {level['failures']} failures", file=sys.stderr)
    finally:
        if t.proc is not None:
            stop(t.proc)
    return {"levels": levels, "command": " ".join(t.cmd), "server_log": str(t.log),
            "prompt_words": list(shape), **({"energy_note": energy.note} if energy.note else {})}


# -- output ------------------------------------------------------------------------------------


def compare_rows(res: dict, file: str) -> list[dict]:
    """RESULTS.md rows: ratio = reflex / peer for rates, peer / reflex for times and joules."""
    ours, peer = res["targets"].get("reflex"), res["targets"].get("llama")
    if not ours or not peer or "levels" not in peer:
        return []
    rows, by_c = [], {lv["clients"]: lv for lv in peer["levels"]}
    for lv in ours["levels"]:
        p = by_c.get(lv["clients"])
        for metric, key, rate in (("serve_c{}_tok_s", "tok_s", True), ("serve_c{}_ttft_p50_s", "ttft_p50_s", False),
                                  ("joules_per_token_c{}", "joules_per_token", False)):
            a, b = lv.get(key), p and p.get(key)
            if a and b:
                rows.append(compare_row(file, metric.format(lv["clients"]), a, b, rate))
    return rows


COLUMNS = (("clients", "clients", "{}"), ("reqs", "requests", "{}"), ("tok/s", "tok_s", "{:.1f}"),
           ("ttft p50 ms", "ttft_p50_s", "ms"), ("ttft p99 ms", "ttft_p99_s", "ms"), ("itl p50 ms", "itl_p50_s", "ms"),
           ("itl p99 ms", "itl_p99_s", "ms"), ("lat p50 s", "latency_p50_s", "{:.3f}"), ("fail", "failures", "{}"),
           ("J/tok", "joules_per_token", "{:.4f}"))


def table(res: dict) -> str:
    cell = lambda v, f: "-" if v is None else f"{v * 1000:.1f}" if f == "ms" else f.format(v)
    lines = [f"{'target':<7}" + "".join(f"{h:>12}" for h, _, _ in COLUMNS)]
    for name, t in res["targets"].items():
        lines += [f"{name:<7}" + "".join(f"{cell(lv[k], f):>12}" for _, k, f in COLUMNS) for lv in t.get("levels", [])]
        lines += [f"{name:<7} {t['note']}"] if "note" in t else []
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="the GGUF file both servers load")
    ap.add_argument("--clients", default="1,4,16,64", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--answer-tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=1, help="runs of each level; the figures are their medians")
    ap.add_argument("--targets", default="reflex,llama")
    ap.add_argument("--parallel", type=int, help="reflex serve's --parallel (default: the most clients)")
    ap.add_argument("--backend", default="auto", choices=("auto", "cuda", "cpu"), help="reflex serve's backend")
    ap.add_argument("--llama-server", default="/tmp/peers/llama.cpp/llama-server")
    ap.add_argument("--gpu", type=int, default=0, help="NVML device index of the energy reading")
    ap.add_argument("--timeout", type=float, default=300, help="seconds at most for each request, and for each level")
    ap.add_argument("--load-timeout", type=float, default=300, help="seconds at most for a server to become ready")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    ap.add_argument("--compare-out", type=Path, help="write or extend this compare.json (RESULTS.md's format)")
    ap.add_argument("--rows-from", type=Path, metavar="SERVE_JSON",
                    help="run nothing: add the compare rows of this saved --out result to --compare-out")
    ap.add_argument("--file-name", help="with --rows-from: the rows' file name (RESULTS.md's, e.g. qwen3moe-30b-a3b-48l-q8_0)")
    ap.add_argument("--commit", help="with --rows-from: the tree that ran (default: this checkout's HEAD)")
    ap.add_argument("--log-dir", type=Path, help="the servers' logs (default: beside --out, else /tmp)")
    args = ap.parse_args(argv)
    if not (args.model or args.rows_from) or (args.rows_from and not args.compare_out):
        ap.error("--model is required (or --rows-from with --compare-out)")
    args.log_dir = args.log_dir or (args.out.parent if args.out else Path("/tmp"))
    if args.rows_from:  # no run: compare rows from a saved result (a run on the GPU machine)
        try:
            res = json.loads(args.rows_from.read_text())
        except (OSError, ValueError) as e:
            raise SystemExit(f"bench_serve: --rows-from {args.rows_from}: {e}")
        name = args.file_name or res["model_file"].removesuffix(".gguf")
        write_compare(args.compare_out, compare_rows(res, name), res.get("gpu"), args.commit)
        return 0
    # `timeout` and kill send SIGTERM: exit through the finally blocks that stop the servers
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    energy = Energy(args.gpu)
    res = {"date": time.strftime("%Y-%m-%d"), "model_file": os.path.basename(args.model), "gpu": energy.gpu,
           "settings": {k: getattr(args, k) for k in ("clients", "requests_per_client", "prompt_tokens",
                                                      "answer_tokens", "runs", "timeout")},
           "targets": {}}
    makers = {"reflex": reflex_target, "llama": llama_target}
    for name in args.targets.split(","):
        if name == "llama" and not os.access(args.llama_server, os.X_OK):
            res["targets"]["llama"] = {"note": f"skipped: no llama-server at {args.llama_server}"}
            print(f"bench_serve: {res['targets']['llama']['note']}", file=sys.stderr)
            continue
        res["targets"][name] = run_target(makers[name](args, free_port()), args, energy)
    print(table(res))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=1) + "\n")
    if args.compare_out:
        rows = compare_rows(res, os.path.basename(args.model).removesuffix(".gguf"))
        if rows:
            write_compare(args.compare_out, rows, energy.gpu)
        else:
            print("bench_serve: no compare rows (both targets needed)", file=sys.stderr)
    return 0 if all(lv["failures"] == 0 for t in res["targets"].values() for lv in t.get("levels", [])) else 1


if __name__ == "__main__":
    sys.exit(main())
