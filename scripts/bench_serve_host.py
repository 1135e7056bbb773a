#!/usr/bin/env python3
"""Host-side ceiling of `reflex serve` (a benchmark, not a test): the real HTTP stack
(frontends/serve.py start -> HttpFront -> openai_mapping -> Engine.generate -> Scheduler) around a
fake batch runner that answers at once, or after --step-ms of GIL-free sleep per step (a GPU
stand-in), so that what is measured is the server's own Python: its CPU and its GIL.

The server runs in a child process of this script (a hidden --serve mode, on 127.0.0.1, a port of
its own choosing), the client here: one thread, non-blocking sockets, N concurrent streaming
/v1/completions requests (--clients 1,16,64, level by level, --requests-per-client each in a row),
a prompt of --prompt-words words (75: ~128 Qwen3 tokens) and --tokens tokens (greedy,
ignore_eos). The child exits when this process closes its stdin (or ends), and is killed after a
grace period otherwise: no server is left behind.

Per level: aggregate tok/s (tokens / the level's wall time), inter-token latency p50/p99 (gaps
between SSE events, all requests pooled, each request's first gap dropped), time to first token
p50; from the server process (getrusage, read at the level's start and end): CPU us per token
(user, sys), voluntary + involuntary context switches per token; from the fake runner: rows per
step, the interval between step starts (p50, mean) and the time inside a step. An answer of another
length, an error or the level's --timeout is a failure. With --profile cprofile, a cProfile of the
server's threads (the scheduler thread and every request handler) per level: --stats-dir/c<N>.prof.

    python scripts/bench_serve_host.py --clients 1,16,64 --requests-per-client 4 --step-ms 1 --out host.json

The tokenizer is the real Qwen3 one (a folder with tokenizer.json and tokenizer_config.json):
--tokenizer, else $REFLEX_QWEN3_TOKENIZER, else ../shared/data/qwen3-tokenizer beside the repo;
--byte-tokenizer uses one token per UTF-8 byte instead (no files needed).
"""

from __future__ import annotations

import argparse
import codecs
import json
import os
import random
import re
import resource
import select
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()
# What the fake runner answers, token after token, round and round.
REPLY = ("The quick brown fox jumps over the lazy dog while the cat sleeps in the sun. Serverless functions start "
         "cold, load a model, and answer one request at a time. The river flows through the valley, past the old "
         "mill and the stone bridge. Once upon a time there was a small village at the edge of a great forest.")
USAGE = re.compile(rb'"usage":\{"prompt_tokens":(\d+),"completion_tokens":(\d+)')
CHUNKED_END = b"data: [DONE]\n\n\r\n0\r\n\r\n"


# -- the server (the child process) ----------------------------------------------------------------


def default_tokenizer_dir() -> str | None:
    for c in (os.environ.get("REFLEX_QWEN3_TOKENIZER"), str(ROOT.parent / "shared" / "data" / "qwen3-tokenizer")):
        if c and (Path(c) / "tokenizer.json").is_file():
            return c
    return None


def qwen3_tokenizer(folder: str):
    """reflex's own Tokenizer built from a Hugging Face tokenizer.json (the metadata a GGUF holds)."""
    from array import array

    from hf_vocab import read_hf_vocab
    from reflex_runtime.text.tokenizer import Tokenizer

    v = read_hf_vocab(folder)
    return Tokenizer.from_metadata({
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": v.tokens,
        "tokenizer.ggml.token_type": array("i", v.types), "tokenizer.ggml.merges": v.merges,
        "tokenizer.ggml.bos_token_id": v.ids["<|endoftext|>"], "tokenizer.ggml.eos_token_id": v.ids[v.config["eos_token"]],
        "tokenizer.ggml.add_bos_token": False, "tokenizer.chat_template": v.config.get("chat_template")})


class ByteTokenizer:
    """One token per UTF-8 byte (id = byte + 10); 1 = BOS, 2 = EOS. Needs no files."""

    BOS, EOS, OFFSET = 1, 2, 10
    bos_id, eos_id, vocab_size = BOS, EOS, 256 + OFFSET
    stop_ids = frozenset({EOS})

    def encode(self, text, add_special=True, parse_special=True):
        return ([self.BOS] if add_special else []) + [b + self.OFFSET for b in text.encode("utf-8")]

    def token_bytes(self, i):
        return {self.BOS: b"<bos>", self.EOS: b"<eos>"}.get(i, bytes([i - self.OFFSET]) if i >= self.OFFSET else b"")

    def decode(self, ids, skip_special=False):
        return b"".join(self.token_bytes(i) for i in ids if not (skip_special and self.is_special(i))).decode(
            "utf-8", "replace")

    def is_special(self, i):
        return i < self.OFFSET

    def stream_decoder(self):
        dec = codecs.getincrementaldecoder("utf-8")("replace")
        return SimpleNamespace(push=lambda i: dec.decode(self.token_bytes(i)),
                               flush=lambda: dec.decode(b"", final=True))


class FastBatchRunner:
    """The batch API (batch_open / batch_step / batch_close) answering at once: one token per
    decode row, one after a prompt's last chunk; step_s of sleep per step (the GIL released, as in
    a GPU sync). Counts steps, rows and the time inside steps."""

    name = "fake-batch"
    checks_deadline = False

    def __init__(self, reply_ids: list[int], max_seqs: int, step_s: float, max_context: int = 4096):
        self.reply, self.max_seqs, self.default_seqs, self.step_s = reply_ids, max_seqs, max_seqs, step_s
        self.max_context = max_context
        self._seqs: dict[int, list[int]] = {}
        self._next = 0
        self.reset()

    def reset(self) -> None:
        self.steps, self.rows, self.in_step = 0, 0, 0.0
        self.starts: list[float] = []

    def info(self):
        return {"device": "fake"}

    def batch_open(self, prompt_ids, pick, max_new, stop_ids):
        self._next += 1
        self._seqs[self._next] = [len(prompt_ids), 0]  # prompt length, positions done
        return self._next

    def batch_step(self, prefill, decode, score=()):
        t0 = time.perf_counter()
        self.starts.append(t0)
        out = {}
        for sid, n in prefill:
            s = self._seqs[sid]
            s[1] += n
            if s[1] >= s[0]:
                out[sid] = [self.reply[0]]
        r = self.reply
        for sid in decode:
            s = self._seqs[sid]
            s[1] += 1
            out[sid] = [r[s[1] % len(r)]]
        if self.step_s:
            time.sleep(self.step_s)
        self.steps += 1
        self.rows += len(decode) + len(prefill)
        self.in_step += time.perf_counter() - t0
        return out

    def batch_close(self, sid):
        self._seqs.pop(sid, None)


class Profiles:
    """cProfile of the server's threads, cut per level: each request handler has its own (kept
    once it returned), the scheduler thread one that mark() swaps between steps."""

    def __init__(self, clock: str):
        import cProfile

        self._new = (lambda: cProfile.Profile(time.thread_time)) if clock == "cpu" else cProfile.Profile
        self._done: list = []
        self._lock = threading.Lock()
        self._engine = None  # the scheduler thread's current profile

    def wrap(self, fn):
        def run(*a, **k):
            p = self._new()
            p.enable()
            try:
                return fn(*a, **k)
            finally:
                p.disable()
                with self._lock:
                    self._done.append(p)
        return run

    def swap_engine(self) -> None:
        """On the scheduler thread: close its profile (if any) and start the next one."""
        if self._engine is not None:
            self._engine.disable()
            with self._lock:
                self._done.append(self._engine)
        self._engine = self._new()
        self._engine.enable()

    def dump(self, path: str | None) -> None:
        import pstats

        with self._lock:
            done, self._done = self._done, []
        stats = None
        for p in done:
            p.create_stats()
            if not p.stats:
                continue
            if stats is None:
                stats = pstats.Stats(p)
            else:
                stats.add(p)
        if path and stats is not None:
            stats.dump_stats(path)


def serve_main(args) -> int:
    """--serve: the real serve stack on 127.0.0.1 around FastBatchRunner. Prints {"port": N} when
    ready, then answers each stdin line "mark NAME" with the counters since the last mark (as one
    JSON line; the profile into --stats-dir/NAME.prof when NAME is not "-"); exits at stdin's end."""
    from reflex_runtime import cli
    from reflex_runtime.engine import Engine, Limits
    from reflex_runtime.frontends import serve

    tok = ByteTokenizer() if args.tokenizer is None else qwen3_tokenizer(args.tokenizer)
    runner = FastBatchRunner(tok.encode(REPLY, add_special=False, parse_special=False), args.parallel,
                             args.step_ms / 1000)
    gguf = SimpleNamespace(path="/nonexistent/fake.gguf", get=lambda key: None)
    config = SimpleNamespace(name="fake-qwen3", arch="qwen3", file_type="F32", vocab_size=tok.vocab_size)
    engine = Engine(gguf, config, tok, runner, model_ref="fake",
                    limits=Limits(max_new_tokens=4096, request_timeout_s=300.0))
    quiet = serve._log
    serve._log = lambda msg: None if " 200 " in msg else quiet(msg)  # access lines of answered requests: not logged

    profiles = Profiles(args.profile_clock) if args.profile == "cprofile" else None
    if profiles is not None:
        serve.Handler.handle = profiles.wrap(serve.Handler.handle)
    sargs = cli.build_parser().parse_args(["serve", "--model", "fake", "--host", "127.0.0.1", "--port", "0",
                                           "--parallel", str(args.parallel), "--stay-up"])
    srv = serve.start(sargs, None, load=lambda a, t: engine)
    if not srv.state.model.wait_settled(60) or engine.scheduler is None:
        raise SystemExit(f"bench_serve_host: the fake model did not load: {srv.state.model.failure}")
    out, sys.stdout = sys.stdout, sys.stderr  # stdout carries the replies only

    last = {"ru": resource.getrusage(resource.RUSAGE_SELF), "t": time.perf_counter()}

    def mark(name: str) -> dict:
        counts = {}

        def on_engine():  # between two steps: the runner's counters are still
            st = runner.starts
            gaps = sorted(b - a for a, b in zip(st, st[1:]))
            counts.update(steps=runner.steps, rows=runner.rows, in_step_s=runner.in_step,
                          step_interval_p50_ms=gaps[len(gaps) // 2] * 1000 if gaps else None,
                          step_interval_mean_ms=(st[-1] - st[0]) / (len(st) - 1) * 1000 if len(st) > 1 else None)
            runner.reset()
            if profiles is not None:
                profiles.swap_engine()

        engine.scheduler.call(on_engine)
        ru, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        r0 = last["ru"]
        res = {"wall_s": t - last["t"], "user_s": ru.ru_utime - r0.ru_utime, "sys_s": ru.ru_stime - r0.ru_stime,
               "vcsw": ru.ru_nvcsw - r0.ru_nvcsw, "ivcsw": ru.ru_nivcsw - r0.ru_nivcsw, **counts}
        if profiles is not None:
            path = None if name == "-" else os.path.join(args.stats_dir, f"{name}.prof")
            profiles.dump(path)
            res["profile"] = path
        last.update(ru=resource.getrusage(resource.RUSAGE_SELF), t=time.perf_counter())  # the dump not counted
        return res

    def control():
        try:
            for line in sys.stdin:
                cmd = line.split()
                if cmd[:1] == ["mark"] and len(cmd) == 2:
                    out.write(json.dumps(mark(cmd[1])) + "\n")
                    out.flush()
        finally:  # stdin's end (the client is done, or gone): stop serving
            srv.shutdown()

    out.write(json.dumps({"port": srv.server_address[1]}) + "\n")
    out.flush()
    threading.Thread(target=control, name="bench-control", daemon=True).start()
    try:
        srv.serve_forever(poll_interval=0.5)
    finally:
        serve.stop(srv)
    return 0


# -- the client (this process) ----------------------------------------------------------------------


class Server:
    """The --serve child: started, asked for its counters, stopped (stdin closed, then killed)."""

    def __init__(self, args):
        cmd = [sys.executable, os.path.abspath(__file__), "--serve", "--parallel", str(args.parallel),
               "--step-ms", str(args.step_ms), "--profile", args.profile, "--profile-clock", args.profile_clock,
               "--stats-dir", str(args.stats_dir)]
        cmd += ["--byte-tokenizer"] if args.tokenizer is None else ["--tokenizer", args.tokenizer]
        pp = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + pp if pp else "")}
        self.cmd = cmd
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, env=env)
        self._buf = b""
        try:
            self.port = self._reply(args.load_timeout)["port"]
        except BaseException:
            self.stop()
            raise

    def _reply(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SystemExit(f"bench_serve_host: the server did not answer within {timeout:g} s")
            if select.select([fd], [], [], left)[0]:
                data = os.read(fd, 1 << 16)
                if not data:
                    raise SystemExit(f"bench_serve_host: the server exited ({self.proc.wait()}); its stderr is above")
                self._buf += data
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def mark(self, name: str = "-") -> dict:
        self.proc.stdin.write(f"mark {name}\n".encode())
        return self._reply(120)

    def stop(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


class Req:
    """One streaming request on a non-blocking socket: its bytes, SSE events and their times."""

    def __init__(self, port: int, client: int, body: bytes):
        self.client, self.t0 = client, time.perf_counter()
        self.buf, self.events, self.last, self.ttft, self.gaps = bytearray(), 0, None, None, []
        self.error, self.tokens, self.prompt_tokens = None, 0, None
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(body)
        self.sock.setblocking(False)

    def feed(self, data: bytes, now: float) -> None:
        start = max(0, len(self.buf) - 1)  # an event end split between two reads is counted once
        self.buf += data
        ev = self.buf.count(b"\n\n", start)  # events complete so far (the usage and [DONE] ones too)
        if ev:
            self.events += ev
            if self.ttft is None:
                self.ttft = now - self.t0
            else:
                self.gaps.append(now - self.last)
            self.last = now

    def finish(self, answer_tokens: int) -> None:
        buf, self.buf = bytes(self.buf), None
        m = USAGE.search(buf)
        if m:
            self.prompt_tokens, self.tokens = int(m.group(1)), int(m.group(2))
        if not buf.startswith(b"HTTP/1.1 200"):
            self.error = "answered " + buf.split(b"\r\n", 1)[0].decode("latin-1")[:100]
        elif not buf.endswith(CHUNKED_END):
            self.error = "the stream did not end with [DONE]: " + buf[-200:].decode("utf-8", "replace")
        elif self.tokens != answer_tokens:
            self.error = f"{self.tokens} tokens, not {answer_tokens}"


def body(args, seed) -> bytes:
    w = [WORDS[i % len(WORDS)] for i in range(args.prompt_words)]
    random.Random(repr(seed)).shuffle(w)
    b = json.dumps({"prompt": "A: " + " ".join(w), "max_tokens": args.tokens, "temperature": 0,
                    "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(b)) + b


def run_requests(port: int, n: int, rpc: int, args) -> tuple[list[Req], float]:
    """n clients, rpc requests each in a row, all on this thread; (every request, wall seconds)."""
    sel = selectors.DefaultSelector()
    left, done, seq = [rpc] * n, [], [0]
    live = n
    deadline = time.monotonic() + args.timeout

    def start(c: int) -> None:
        nonlocal live
        while left[c] > 0:
            left[c] -= 1
            seq[0] += 1
            try:
                r = Req(port, c, body(args, (n, c, seq[0])))
            except OSError as e:
                done.append(SimpleNamespace(error=f"connect: {e}", tokens=0, ttft=None, gaps=[], prompt_tokens=None))
                continue
            sel.register(r.sock, selectors.EVENT_READ, r)
            return
        live -= 1

    t0 = time.perf_counter()
    for c in range(n):
        start(c)
    while live:
        wait = deadline - time.monotonic()
        if wait <= 0:
            for key in list(sel.get_map().values()):
                sel.unregister(key.fileobj)
                key.fileobj.close()
                key.data.buf, key.data.error = None, "level timeout"
                done.append(key.data)
            done += [SimpleNamespace(error="level timeout", tokens=0, ttft=None, gaps=[], prompt_tokens=None)
                     for c in range(n) for _ in range(left[c])]
            break
        for key, _ in sel.select(wait):
            r = key.data
            try:
                data = r.sock.recv(1 << 16)
            except BlockingIOError:
                continue
            except OSError as e:
                data, r.error = b"", f"recv: {e}"
            now = time.perf_counter()
            if data:
                r.feed(data, now)
            if not data or r.buf.endswith(CHUNKED_END):
                sel.unregister(r.sock)
                r.sock.close()
                if r.error is None:
                    r.finish(args.tokens)
                r.buf = None
                done.append(r)
                start(r.client)
    sel.close()
    return done, time.perf_counter() - t0


def pct_ms(xs: list[float], q: float) -> float | None:
    return round(xs[min(len(xs) - 1, int(q * len(xs)))] * 1000, 3) if xs else None


def level(server: Server, n: int, args) -> dict:
    server.mark()  # the counters start here
    done, wall = run_requests(server.port, n, args.requests_per_client, args)
    time.sleep(0.1)  # the handlers' last writes and closes belong to this level
    srv = server.mark(f"c{n}")
    ok = [r for r in done if r.error is None]
    tokens = sum(r.tokens for r in ok)
    gaps = sorted(g for r in done for g in r.gaps[1:])  # the first gap may hold the prompt's last chunk
    ttft = sorted(r.ttft for r in done if r.ttft is not None)
    per_tok = lambda x, k=1e6: round(x / tokens * k, 2) if tokens else None  # noqa: E731
    res = {"clients": n, "requests": len(done), "tokens": tokens, "failures": len(done) - len(ok),
           "failure_examples": sorted({r.error for r in done if r.error})[:5],
           "prompt_tokens": ok[0].prompt_tokens if ok else None, "wall_s": round(wall, 4),
           "tok_s": round(tokens / wall, 1) if wall > 0 else None,
           "itl_p50_ms": pct_ms(gaps, 0.5), "itl_p99_ms": pct_ms(gaps, 0.99), "ttft_p50_ms": pct_ms(ttft, 0.5),
           "server_cpu_us_per_tok": per_tok(srv["user_s"] + srv["sys_s"]),
           "server_user_us_per_tok": per_tok(srv["user_s"]), "server_sys_us_per_tok": per_tok(srv["sys_s"]),
           "ctx_switches_per_tok": per_tok(srv["vcsw"] + srv["ivcsw"], 1),
           "vol_ctx_switches_per_tok": per_tok(srv["vcsw"], 1), "invol_ctx_switches_per_tok": per_tok(srv["ivcsw"], 1),
           "steps": srv["steps"], "rows_per_step": round(srv["rows"] / srv["steps"], 2) if srv["steps"] else None,
           "step_p50_ms": None if srv["step_interval_p50_ms"] is None else round(srv["step_interval_p50_ms"], 3),
           "step_mean_ms": None if srv["step_interval_mean_ms"] is None else round(srv["step_interval_mean_ms"], 3),
           "in_step_ms": round(srv["in_step_s"] / srv["steps"] * 1000, 3) if srv["steps"] else None}
    if "profile" in srv:
        res["profile"] = srv["profile"]
    return res


COLUMNS = (("clients", "clients", "{}"), ("tok/s", "tok_s", "{:.0f}"), ("itl p50", "itl_p50_ms", "{:.3f}"),
           ("itl p99", "itl_p99_ms", "{:.3f}"), ("ttft p50", "ttft_p50_ms", "{:.2f}"),
           ("cpu us/tok", "server_cpu_us_per_tok", "{:.1f}"), ("user", "server_user_us_per_tok", "{:.1f}"),
           ("sys", "server_sys_us_per_tok", "{:.1f}"), ("csw/tok", "ctx_switches_per_tok", "{:.2f}"),
           ("rows/step", "rows_per_step", "{:.1f}"), ("step p50", "step_p50_ms", "{:.3f}"),
           ("step mean", "step_mean_ms", "{:.3f}"), ("in step", "in_step_ms", "{:.3f}"), ("fail", "failures", "{}"))


def table(levels: list[dict]) -> str:
    cell = lambda v, f: "-" if v is None else f.format(v)  # noqa: E731
    lines = ["".join(f"{h:>11}" for h, _, _ in COLUMNS) + "   (times in ms)"]
    lines += ["".join(f"{cell(lv[k], f):>11}" for _, k, f in COLUMNS) for lv in levels]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", default="1,16,64", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--requests-per-client", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128, help="tokens each answer asks for (ignore_eos)")
    ap.add_argument("--prompt-words", type=int, default=75, help="words of each prompt (75: ~128 Qwen3 tokens)")
    ap.add_argument("--step-ms", type=float, default=0.0, help="the fake runner's GIL-free sleep per step")
    ap.add_argument("--parallel", type=int, help="the server's --parallel (default: the most clients)")
    ap.add_argument("--tokenizer", help="the Qwen3 tokenizer folder (default: $REFLEX_QWEN3_TOKENIZER, "
                                        "else ../shared/data/qwen3-tokenizer beside the repo)")
    ap.add_argument("--byte-tokenizer", action="store_true", help="one token per byte instead (no files)")
    ap.add_argument("--profile", choices=("none", "cprofile"), default="none",
                    help="cprofile: a .prof of the server's threads per level in --stats-dir")
    ap.add_argument("--profile-clock", choices=("wall", "cpu"), default="wall",
                    help="the profile's clock: wall time, or each thread's CPU time")
    ap.add_argument("--stats-dir", type=Path, help="where the profiles go (default: beside --out, else the temp dir)")
    ap.add_argument("--timeout", type=float, default=120, help="seconds at most for each level")
    ap.add_argument("--load-timeout", type=float, default=120, help="seconds at most for the server to start")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the child: the server
    args = ap.parse_args(argv)
    if args.byte_tokenizer:
        args.tokenizer = None
    elif args.tokenizer is None:
        args.tokenizer = default_tokenizer_dir()
        if args.tokenizer is None:
            ap.error("no Qwen3 tokenizer: give --tokenizer, set $REFLEX_QWEN3_TOKENIZER, or use --byte-tokenizer")
    elif not (Path(args.tokenizer) / "tokenizer.json").is_file():
        ap.error(f"--tokenizer {args.tokenizer}: no tokenizer.json there")
    args.parallel = args.parallel or max(args.clients)
    scratch = args.out.parent if args.out else Path(tempfile.gettempdir())
    args.stats_dir = args.stats_dir or scratch / "bench_serve_host"
    if args.serve:
        return serve_main(args)
    if args.profile != "none":
        args.stats_dir.mkdir(parents=True, exist_ok=True)
    # `timeout` and kill send SIGTERM: exit through the finally block that stops the server
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    server = Server(args)
    try:
        run_requests(server.port, 2, 1, args)  # warm-up (imports, tokenizer caches): not reported
        levels = []
        for n in args.clients:
            levels.append(level(server, n, args))
            print(f"bench_serve_host: c={n}: {levels[-1]['tok_s']} tok/s, {levels[-1]['failures']} failures",
                  file=sys.stderr)
    finally:
        server.stop()
    res = {"date": time.strftime("%Y-%m-%d"), "python": sys.version.split()[0], "cpus": os.cpu_count(),
           "tokenizer": args.tokenizer or "bytes", "server": " ".join(server.cmd), "server_pid": server.proc.pid,
           "port": server.port,
           "settings": {k: getattr(args, k) for k in ("clients", "requests_per_client", "tokens", "prompt_words",
                                                      "step_ms", "parallel", "profile", "timeout")},
           "levels": levels}
    print(table(levels))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0 if all(lv["failures"] == 0 for lv in levels) else 1


if __name__ == "__main__":
    sys.exit(main())
