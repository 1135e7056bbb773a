"""The scheduler (reflex_runtime/scheduler.py): batched requests give what each gives alone, steps
interleave prompt chunks with decodes, a full queue is Busy (429 over HTTP, an error line over
uds), and the legacy path (a runner without the batch API) still works through it."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import tempfile
import threading
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest

from reflex_runtime.engine import Finished, GenerateRequest, SamplingParams
from reflex_runtime.errors import Busy
from reflex_runtime.frontends import ipc, serve
from reflex_runtime.scheduler import EnergyShare

from fake_engine import REPLY, make_engine

PROMPTS = ["The capital of France is", "Once upon a time", "1, 2, 3, 4,", "Hello"]


@pytest.fixture
def cpu_engine(fixture_paths):
    """A fresh CPU engine (no scheduler yet) on a fixture's f32 file."""
    from reflex_runtime.loader import load_engine

    return lambda arch: load_engine(str(fixture_paths(arch, "f32").gguf), "cpu")


def _req(prompt, n, **kw) -> GenerateRequest:
    return GenerateRequest(prompt=prompt, max_tokens=n, ignore_eos=True, **kw)


def _run(engine, req, events=None) -> Finished:
    for ev in engine.generate(req):
        if events is not None:
            events.append(ev)
        if isinstance(ev, Finished):
            return ev
    raise AssertionError("no Finished")


def _concurrently(engine, reqs) -> list[Finished]:
    out = [None] * len(reqs)

    def one(i):
        out[i] = _run(engine, reqs[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return out


@pytest.mark.parametrize("arch", ["gemma3", "qwen35"])
def test_batched_greedy_and_seeded_equal_each_request_alone(cpu_engine, arch):
    eng = cpu_engine(arch)
    reqs = [_req(p, 6 + 3 * i) for i, p in enumerate(PROMPTS)]
    reqs += [_req(p, 8, sampling=SamplingParams(temperature=0.9, top_k=40, seed=7 + i)) for i, p in enumerate(PROMPTS[:2])]
    alone = [_run(eng, r) for r in reqs]  # the CLI path: the runner's own loop, no scheduler
    sched = eng.start_scheduler(max_seqs=4)
    try:
        batched = _concurrently(eng, reqs)
    finally:
        eng.stop_scheduler()
    assert [f.text for f in batched] == [f.text for f in alone]
    assert [f.record["generated_tokens"] for f in batched] == [r.max_tokens for r in reqs]  # the max_tokens cap
    assert max(len(p) + len(d) for p, d in sched.step_log) > 1  # they did share steps
    for f in batched:
        rec = f.record
        assert rec["queue_wait_ms"] >= 0 and rec["prefill_ms"] >= 0 and rec["decode_tokens_per_s"] > 0
        b = rec["batch_sizes"]
        assert 1 <= b["min"] <= b["mean"] <= b["max"] <= 4 and rec["joules_attributed"] is None


def test_a_request_joins_mid_decode_and_a_long_prompt_goes_in_chunks(cpu_engine):
    eng = cpu_engine("gemma3")
    long_prompt = " ".join(["word"] * 60)
    want_b = _run(eng, _req(long_prompt, 4)).text
    eng.limits = replace(eng.limits, prefill_chunk=8)
    sched = eng.start_scheduler(max_seqs=2)
    try:
        gen_a = eng.generate(_req(PROMPTS[0], 40))
        next(gen_a), next(gen_a)  # A is decoding
        got_b = {}
        t = threading.Thread(target=lambda: got_b.update(f=_run(eng, _req(long_prompt, 4))))
        t.start()
        rest_a = [ev for ev in gen_a]
        t.join(120)
    finally:
        eng.stop_scheduler()
    assert got_b["f"].text == want_b and isinstance(rest_a[-1], Finished)
    sid_a = sched.step_log[0][0][0][0]
    b_steps = [(p, d) for p, d in sched.step_log if any(sid != sid_a for sid, _ in p)]
    assert len(b_steps) >= 60 // 8  # B's prompt took several steps, at most 8 tokens each
    assert all(n <= 8 for p, _ in b_steps for _, n in p)
    assert all(sid_a in d for _, d in b_steps)  # A decoded a token in every one of them
    assert got_b["f"].record["batch_sizes"]["max"] == 2


def test_a_step_holds_no_more_prompt_than_the_runners_pass(cpu_engine):
    """The limit's 512 prompt tokens a step are one CUDA forward; the numpy runner's pass is 256
    (reference.runner.PREFILL_CHUNK), and a step of two passes would let the request timeout
    overshoot by two. The smaller of the two is the step's budget."""
    from reflex_runtime.reference.runner import PREFILL_CHUNK

    eng = cpu_engine("gemma3")
    assert eng.limits.prefill_chunk > PREFILL_CHUNK
    sched = eng.start_scheduler(max_seqs=2)
    try:
        _run(eng, _req(" ".join(["word"] * 300), 2))
    finally:
        eng.stop_scheduler()
    sizes = [n for p, _ in sched.step_log for _, n in p]
    assert sum(sizes) > PREFILL_CHUNK and max(sizes) == PREFILL_CHUNK, sizes


@pytest.mark.parametrize("arch", ["gemma3", "qwen35"])
def test_system1_joins_a_running_batch_and_scores_as_alone(cpu_engine, arch):
    """A system1 request on a batching runner is a sequence of one step (scheduler.Scoring): it
    runs beside the decodes (one step holds both), takes its cache from the pool and gives it
    back, and scores what it scores alone; its record has the scheduler's fields."""
    eng = cpu_engine(arch)
    cands = ["Paris", " Paris", "London is big"]
    alone = eng.system1(prompt=PROMPTS[0], candidates=cands)
    want_gen = _run(eng, _req(PROMPTS[1], 30)).text
    sched = eng.start_scheduler(max_seqs=4)
    try:
        gen = eng.generate(_req(PROMPTS[1], 30))
        next(gen), next(gen)  # decoding
        got = eng.system1(prompt=PROMPTS[0], candidates=cands)
        rest = [ev for ev in gen]
    finally:
        eng.stop_scheduler()
    assert [c["token_logprobs"] for c in got["candidates"]] == [c["token_logprobs"] for c in alone["candidates"]]
    assert rest[-1].text == want_gen
    n_tree = got["record"]["prompt_tokens"] + sum(len(c["token_ids"]) for c in got["candidates"])
    scored = [(p, d) for p, d in sched.step_log if any(n == n_tree for _, n in p)]
    assert len(scored) == 1 and scored[0][1], "one step scored it, beside the running decode"
    rec = got["record"]
    assert rec["queue_wait_ms"] >= 0 and rec["batch_sizes"]["max"] == 2 and rec["joules_attributed"] is None
    assert eng.runner.pool.free_tokens == eng.runner.pool.tokens  # every block came back


def test_system1_waits_for_room_in_the_kv_cache(fixture_paths):
    """A tree the pool cannot hold yet waits first in line (as a generate request does) and runs
    once the running request gives its blocks back; one larger than the context is a 4xx error."""
    from reflex_runtime.errors import RequestError
    from reflex_runtime.loader import load_engine

    eng = load_engine(str(fixture_paths("gemma3", "f32").gguf), "cpu", max_context=64, max_seqs=4, kv_tokens=64)
    cands = ["a b c d e f g h i j k l m n o p q r s t u v w x y z", "no"]
    alone = eng.system1(prompt=PROMPTS[0], candidates=cands)
    sched = eng.start_scheduler(max_seqs=4)
    try:
        gen = eng.generate(_req(PROMPTS[1], 50))  # <= 60 tokens: 4 blocks, the whole pool
        next(gen)
        got = eng.system1(prompt=PROMPTS[0], candidates=cands)
        rest = [ev for ev in gen]
        with pytest.raises(RequestError, match="exceed the context of 64"):
            eng.system1(prompt=" ".join(["word"] * 70), candidates=["x"])
    finally:
        eng.stop_scheduler()
    assert isinstance(rest[-1], Finished) and rest[-1].record["generated_tokens"] == 50
    assert got["best_index"] == alone["best_index"] and got["record"]["queue_wait_ms"] > 0
    scored = next(i for i, (p, _) in enumerate(sched.step_log) if len(p) == 1 and p[0][1] > 30)
    assert not any(sched.step_log[i][1] for i in range(scored, len(sched.step_log)))  # after the generate ended
    assert eng.runner.pool.free_tokens == 64


def test_a_full_kv_cache_makes_requests_wait_their_turn(fixture_paths):
    """The paged cache's pool (kvpool.py; --kv-tokens) holds two of these requests' prompt +
    max_tokens at once: the other two wait in the queue (never refused, never cut short) and run
    as blocks come back; everyone gets what they get alone. The numpy runner keeps the CUDA
    runner's accounting, so this is the GPU's waiting too (tests/test_gpu_batch.py runs it there)."""
    from reflex_runtime.loader import load_engine

    eng = load_engine(str(fixture_paths("gemma3", "f32").gguf), "cpu", max_context=64, max_seqs=4, kv_tokens=64)
    assert eng.runner.pool.tokens == 64
    reqs = [_req(p, 20) for p in PROMPTS]  # each: <= 12 prompt tokens + 20 -> 2 blocks of 16
    alone = [_run(eng, r).text for r in reqs]
    sched = eng.start_scheduler(max_seqs=4)
    try:
        batched = _concurrently(eng, reqs)
    finally:
        eng.stop_scheduler()
    assert [f.text for f in batched] == alone
    assert max(len(p) + len(d) for p, d in sched.step_log) == 2  # never more than the pool holds
    assert eng.runner.pool.free_tokens == 64  # every block came back


def test_a_queue_held_back_by_the_kv_cache_is_full_at_max_queue(fixture_paths):
    """Free sequences are no room while the KV cache keeps the first in line waiting: with no
    queue, the request behind it is 429, not a second one waiting."""
    from reflex_runtime.loader import load_engine

    eng = load_engine(str(fixture_paths("gemma3", "f32").gguf), "cpu", max_context=64, max_seqs=4, kv_tokens=64)
    sched = eng.start_scheduler(max_seqs=4, max_queue=0)
    try:
        first = eng.generate(_req(PROMPTS[0], 50))
        next(first)  # running: it holds the whole pool
        waiting = threading.Thread(target=lambda: _run(eng, _req(PROMPTS[1], 40)))
        waiting.start()
        deadline = time.monotonic() + 30
        while not sched._no_room and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sched._no_room  # the second could not be admitted
        with pytest.raises(Busy):
            next(eng.generate(_req(PROMPTS[2], 2)))
        first.close()
        waiting.join(120)
        assert not waiting.is_alive()
    finally:
        eng.stop_scheduler()


def test_a_closed_request_frees_its_slot(cpu_engine):
    eng = cpu_engine("gemma3")
    sched = eng.start_scheduler(max_seqs=2, max_queue=0)
    try:
        gens = [eng.generate(_req(p, 200)) for p in PROMPTS[:2]]
        for g in gens:
            next(g)
        with pytest.raises(Busy):  # both slots taken, no queue
            next(eng.generate(_req(PROMPTS[2], 2)))
        gens[0].close()  # a client that left
        time.sleep(0.2)
        assert _run(eng, _req(PROMPTS[2], 2)).record["generated_tokens"] == 2
        gens[1].close()
    finally:
        eng.stop_scheduler()
    assert sched.step_log


class Sink:
    mj = 0.0  # what a Ticket gets attributed


class Clock:
    t = 0.0

    def __call__(self):
        return self.t


def test_energy_is_shared_per_token():
    clock, reads = Clock(), iter([1000.0, 1040.0])
    share = EnergyShare(lambda: next(reads), clock=clock, thread=False)  # reads 1000 mJ at t = 0
    clock.t = 0.1
    share.sample()  # 1040 mJ at t = 0.1
    a, b = Sink(), Sink()
    share.share(0.0, 0.1, [(a, 3), (b, 1)])  # e.g. a 2-token prompt chunk and a decode: 40 mJ over 4 tokens
    assert (a.mj, b.mj) == pytest.approx((30.0, 10.0))


def test_energy_past_the_last_reading_is_extrapolated_and_steps_chain():
    """Steps back to back share the counter's whole rise: past the newest reading at the recent
    power, and a later reading's jump goes to the step that sees it (never counted twice)."""
    clock, reads = Clock(), iter([0.0, 100.0, 400.0])
    share = EnergyShare(lambda: next(reads), clock=clock, thread=False)
    clock.t = 0.1
    share.sample()  # 1 W so far
    a = Sink()
    share.share(0.1, 0.2, [(a, 1)])  # no reading yet: 100 mJ at 1 W
    assert a.mj == pytest.approx(100.0)
    clock.t = 0.3
    share.sample()  # 400 mJ at t = 0.3: 300 mJ since the last reading, 100 of them already given
    share.share(0.2, 0.3, [(a, 1)])
    assert a.mj == pytest.approx(300.0)  # the counter's whole rise from t = 0.1 (100 -> 400 mJ)
    b = Sink()
    share.share(0.9, 1.0, [(b, 2)])  # after an idle gap: only its own interval (1.5 W: the readings of the last 0.25 s)
    assert b.mj == pytest.approx(150.0)


def test_energy_without_a_reading_yet_shares_nothing_and_fails_nothing():
    """A counter whose reads fail (NVML answers None) until later: steps before the first reading
    share nothing, and nothing raises into the step."""
    clock, reads = Clock(), iter([None, 500.0, 600.0])
    share = EnergyShare(lambda: next(reads), clock=clock, thread=False)
    a = Sink()
    share.share(0.0, 0.1, [(a, 1)])
    assert a.mj == 0.0
    clock.t = 0.2
    share.sample()
    clock.t = 0.3
    share.sample()
    share.share(0.2, 0.3, [(a, 1)])
    assert a.mj == pytest.approx(100.0)


def test_records_attribute_energy_from_a_counter():
    eng = make_engine(delay=0.002)
    t_start = time.perf_counter()
    eng.start_scheduler(energy=lambda: 1000.0 * time.perf_counter())  # 1 W
    try:
        recs = [f.record for f in _concurrently(eng, [_req("hi", 20), _req("yo", 30)])]
    finally:
        eng.stop_scheduler()
    busy = time.perf_counter() - t_start
    assert all(r["joules_attributed"] > 0 for r in recs)
    assert sum(r["joules_attributed"] for r in recs) <= busy * 1.05


def test_a_slow_energy_counter_never_holds_a_step_or_an_answer():
    """The counter is read on a thread of its own: with every read after the first blocked, a
    request still runs to its end (NVML reads take milliseconds on a GPU)."""
    gate, calls = threading.Event(), []

    def counter():
        calls.append(1)
        if len(calls) > 1:
            gate.wait(30)
        return 1000.0 * time.perf_counter()

    eng = make_engine(delay=0.001)
    eng.start_scheduler(energy=counter)
    try:
        done = _concurrently(eng, [_req("hi", 10), _req("yo", 12)])
        assert [f.record["generated_tokens"] for f in done] == [10, 12]
        assert not gate.is_set()  # both answered while a read was blocked
    finally:
        gate.set()
        eng.stop_scheduler()


def test_the_legacy_path_runs_one_at_a_time_on_the_scheduler_thread():
    eng = make_engine(delay=0.001)
    eng.start_scheduler()
    try:
        out = _concurrently(eng, [_req("a", 5 + i) for i in range(4)])
        s1 = eng.system1(prompt="x", candidates=["Hel", "no"])
    finally:
        eng.stop_scheduler()
    assert [f.text for f in out] == [REPLY[:5 + i] for i in range(4)]
    assert all(f.record["batch_sizes"] == {"min": 1, "max": 1, "mean": 1.0} for f in out)
    assert eng.runner.threads == {"reflex-engine"} and s1["best_text"] == "Hel"  # ScriptedRunner: no overlap


# -- a full queue over the transports -------------------------------------------------------------


def _post(port, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", "/v1/completions", body=json.dumps(body))
    return c


def test_a_full_queue_is_429_with_retry_after_over_http(monkeypatch):
    monkeypatch.setattr(serve, "_log", lambda msg: None)
    eng = make_engine(delay=0.05)
    args = SimpleNamespace(host="127.0.0.1", port=0, api_key=None, model=None, backend="cpu", ctx=None,
                           stay_up=True, parallel=1, max_queue=1)
    srv = serve.start(args, None, load=lambda a, tl: eng)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    port = srv.server_address[1]
    try:
        srv.state.model.wait_settled(5)
        running = _post(port, {"prompt": "a", "max_tokens": 20})
        time.sleep(0.2)
        waiting = _post(port, {"prompt": "b", "max_tokens": 2})
        time.sleep(0.2)
        r = _post(port, {"prompt": "c", "max_tokens": 2}).getresponse()
        body = json.loads(r.read())
        assert r.status == 429 and int(r.getheader("Retry-After")) >= 1
        assert body["error"]["code"] == "busy" and body["error"]["type"] == "rate_limit_error"
        assert running.getresponse().status == 200 and waiting.getresponse().status == 200
    finally:
        srv.shutdown()
        serve.stop(srv)


@contextlib.contextmanager
def _uds(engine):
    d = tempfile.mkdtemp(prefix="reflex-test-", dir="/tmp")
    path = os.path.join(d, "s.sock")
    sock = ipc.bind_socket(path)
    t = threading.Thread(target=ipc.serve_socket, args=(engine, sock, {"id": None, "op": "ready"}), daemon=True)
    t.start()
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            bye = socket.socket(socket.AF_UNIX)
            bye.connect(path)
            bye.sendall(b'{"op": "shutdown"}\n')
            t.join(10)
            bye.close()
        sock.close()
        os.unlink(path)
        os.rmdir(d)


def test_a_full_queue_is_an_error_line_over_uds():
    eng = make_engine(delay=0.05)
    eng.start_scheduler(max_seqs=1, max_queue=0)
    try:
        with _uds(eng) as path:
            a, b = socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)
            a.connect(path)
            b.connect(path)
            fa, fb = a.makefile("rb"), b.makefile("rb")
            assert json.loads(fa.readline())["op"] == "ready" and json.loads(fb.readline())["op"] == "ready"
            a.sendall(b'{"id": 1, "op": "generate", "prompt": "x", "max_tokens": 20}\n')
            time.sleep(0.2)
            b.sendall(b'{"id": 2, "op": "generate", "prompt": "y", "max_tokens": 2}\n')
            err = json.loads(fb.readline())
            assert err["id"] == 2 and err["error"]["status"] == 429 and err["error"]["code"] == "busy"
            assert err["error"]["retry_after_s"] >= 1
            assert json.loads(fa.readline())["record"]["generated_tokens"] == 20
            for s in (fa, fb, a, b):
                s.close()
    finally:
        eng.stop_scheduler()


def test_busy_is_429_with_retry_after_in_every_error_shape():
    from reflex_runtime.api.responses import error_response, line_error

    err = Busy("the server is busy", 2.4)
    r = error_response(err)  # serve and the handler's HTTP events and direct invokes
    assert r.status == 429 and r.headers["Retry-After"] == "2" and r.body["error"]["code"] == "busy"
    line = line_error(7, err)["error"]
    assert line["status"] == 429 and line["retry_after_s"] == 2.4 and "\n" not in line["message"]


# -- failures on the scheduler thread: no consumer waits forever ------------------------------------


class _StubRunner:
    """A batch-API runner whose steps produce nothing (prompts never end) or fail."""

    max_seqs = 4

    def __init__(self, fail: str = ""):
        self.fail, self.closed, self.n = fail, [], 0

    def batch_open(self, prompt, pick, max_new, stop_ids):
        self.n += 1
        return self.n

    def batch_step(self, prefill, decode, score=()):
        if self.fail:
            raise RuntimeError(self.fail)
        time.sleep(0.01)
        return {}

    def batch_close(self, sid):
        self.closed.append(sid)
        if self.fail:
            raise RuntimeError(self.fail + " (sticky)")


def _scheduler(runner, chunk=4):
    from reflex_runtime.scheduler import Scheduler

    return Scheduler(runner, SimpleNamespace(max_seqs=4, max_queue=4, prefill_chunk=chunk), None)


def _consume(ticket, out: list) -> threading.Thread:
    def run():
        try:
            out.append(list(ticket))
        except Exception as e:  # noqa: BLE001 - what the consumer was told
            out.append(e)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


def test_a_deadline_in_the_prompt_is_a_timeout_not_an_empty_answer():
    from reflex_runtime.errors import RequestTimeout
    from reflex_runtime.sampling import Pick

    s = _scheduler(_StubRunner(), chunk=1)
    try:
        t = s.submit(list(range(100)), Pick(), 5, frozenset(), deadline=time.perf_counter() + 0.1)
        with pytest.raises(RequestTimeout, match="prompt tokens"):
            list(t)
    finally:
        s.stop()


def test_a_client_that_leaves_mid_prompt_frees_its_slot_and_its_consumer():
    from reflex_runtime.sampling import Pick

    runner, left = _StubRunner(), threading.Event()
    s = _scheduler(runner)
    try:
        t = s.submit(list(range(500)), Pick(), 5, frozenset(), gone=left.is_set)
        out: list = []
        th = _consume(t, out)
        time.sleep(0.05)
        left.set()
        th.join(5)
        assert not th.is_alive() and out == [[]]
        assert runner.closed == [1]
    finally:
        s.stop()


def test_a_failing_runner_ends_every_running_request_and_the_scheduler_goes_on():
    from reflex_runtime.sampling import Pick

    s = _scheduler(_StubRunner(fail="device lost"))
    try:
        outs = [[] for _ in range(3)]
        threads = [_consume(s.submit([1, 2, 3], Pick(), 5, frozenset()), out) for out in outs]
        for th in threads:
            th.join(5)
            assert not th.is_alive()
        assert all(isinstance(out[0], RuntimeError) and "device lost" in str(out[0]) for out in outs)
        assert s._thread.is_alive()  # noqa: SLF001 - the next request is still served (and fails alike)
        late: list = []
        _consume(s.submit([4], Pick(), 5, frozenset()), late).join(5)
        assert isinstance(late[0], RuntimeError)
    finally:
        s.stop()
