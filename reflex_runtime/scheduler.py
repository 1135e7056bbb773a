"""One scheduler per engine: continuous batching's host side, shared by every serving front end.

ONE thread owns the runner. Requests are submitted from any thread: a generate request becomes a
`Ticket` (an iterator over its tokens, consumed on the caller's thread), a system1 request a
`Scoring` (the caller waits for its scores). Each loop iteration admits waiting requests into free
sequence slots (FIFO; one whose cache the runner's KV pool cannot hold yet, NoRoom, waits first
in line for running ones to end), runs one `runner.batch_step` (prompt chunks and system1 trees,
at most `prefill_chunk` tokens in all, beside one decode token for every running sequence), hands
each request its tokens or scores and retires the finished and the cancelled (a consumer that
closes its ticket frees the slot at the next step). A runner without the batch API (`max_seqs` <
2) runs one request at a time through its `generate_ids` and `score` on the same thread.
docs/INTERNALS.md "Scheduler" has the runner contract.
"""

from __future__ import annotations

import collections
import math
import queue
import threading
import time

from .errors import Busy, NoRoom, ReflexError, RequestTimeout
from .sampling import Sampled
from .tree import tree_tokens

ENERGY_PERIOD_S = 0.02  # the energy counter is read this often while steps run (NVML's ticks are ~20-100 ms)
IDLE_READ_S = 1.0  # and this often when no step ran for a second
RATE_WINDOW_S = 0.25  # past the newest reading: the power over this many seconds of readings before it
STEP_GAP_S = 0.005  # a step starting within this of the last one's end continues its energy
STEP_LOG = 1024  # steps kept in Scheduler.step_log


class _Request:
    """What the scheduler keeps of every request it admits: its sequence, times, the batch sizes
    of its steps and the energy attributed to it."""

    def __init__(self, deadline=None):
        self.deadline = deadline
        self.cancelled = False
        self.sid = None
        self.t_submit = time.perf_counter()
        self.t_admit = self.t_first = None
        self.sizes = [0, 0, 0, 0]  # batch sizes of its steps: count, min, max, sum
        self.mj = 0.0  # attributed energy, millijoules

    def abandoned(self) -> bool:
        return self.cancelled

    def took_part(self, size: int) -> None:
        s = self.sizes
        s[1] = size if s[0] == 0 else min(s[1], size)
        s[2] = max(s[2], size)
        s[0] += 1
        s[3] += size

    def stats(self, energy: bool) -> dict:
        """The record fields the scheduler adds (docs/INTERNALS.md, "The request record")."""
        n, lo, hi, total = self.sizes
        ms = lambda a, b: round((b - a) * 1000, 3) if a is not None and b is not None else None  # noqa: E731
        return {"queue_wait_ms": ms(self.t_submit, self.t_admit), "prefill_ms": ms(self.t_admit, self.t_first),
                "batch_sizes": {"min": lo, "max": hi, "mean": round(total / n, 3)} if n else None,
                "joules_attributed": round(self.mj / 1000, 6) if energy else None}


class Ticket(_Request):
    """One generate request. The scheduler thread writes its progress and stats; the consumer
    iterates its tokens (int, or Sampled with logprobs) and may close() it at any time."""

    def __init__(self, prompt, pick, max_new, stop_ids, deadline, wake, gone=None):
        super().__init__(deadline)
        self.prompt, self.pick, self.max_new, self.stop_ids = prompt, pick, max_new, stop_ids
        self.gone = gone  # the front end's "client left" check, asked until the first token
        self.fed = self.n_out = 0  # prompt tokens forwarded, tokens picked
        self._box: queue.SimpleQueue = queue.SimpleQueue()
        self._pending: collections.deque = collections.deque()
        self._ended = False
        self._wake = wake

    # -- the consumer's side ---------------------------------------------------------------------

    def __iter__(self):
        return self

    def __next__(self):
        while not self._pending:
            if self._ended:
                raise StopIteration
            kind, val = self._box.get()
            if kind == "tokens":
                self._pending.extend(val)
            else:
                self._ended = True
                if kind == "error":
                    raise val
        return self._pending.popleft()

    def abandoned(self) -> bool:
        """Closed, or its client left before its first token (its consumer is blocked until then)."""
        if not self.cancelled and self.t_first is None and self.gone is not None and self.gone():
            self.cancelled = True
        return self.cancelled

    def close(self) -> None:
        if not self._ended:
            self._ended = True
            self.cancelled = True
            self._wake()

    def deliver(self, toks: list) -> bool:
        """Pass on the tokens up to the first that ends the sequence; True when it ended."""
        if self.t_first is None:
            self.t_first = time.perf_counter()
        out, done = [], False
        for tok in toks:
            if tok is None:  # the grammar allows nothing: the sequence ends
                done = True
                break
            out.append(tok)
            self.n_out += 1
            c = self.pick.constraint
            tid = tok.token_id if isinstance(tok, Sampled) else tok
            if tid in self.stop_ids or self.n_out >= self.max_new or (c is not None and c.finished):
                done = True  # a finished grammar: only a stop token could follow (the engine's rule)
                break
        if out:
            self._box.put(("tokens", out))
        return done

    def end(self, error: BaseException | None = None) -> None:
        self._box.put(("error", error) if error is not None else ("end", None))


class Scoring(_Request):
    """One system1 request on a batching runner: a sequence for one step, whose forward scores
    the candidates (runner.batch_open_score); the caller waits for the result."""

    def __init__(self, prompt, candidates):
        super().__init__()
        self.prompt, self.candidates = prompt, candidates
        self.n_tokens = tree_tokens(prompt, candidates)
        self.result = self.error = None
        self.done = threading.Event()

    def deliver(self, result) -> bool:
        self.t_first = time.perf_counter()
        self.result = result
        return True

    def end(self, error: BaseException | None = None) -> None:
        if error is not None and self.result is None:
            self.error = error
        self.done.set()


class _Call:
    """A function run on the scheduler thread (system1's score); the caller waits for it."""

    def __init__(self, fn):
        self.fn, self.done = fn, threading.Event()
        self.result = self.error = None
        self.cancelled = False

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as e:  # noqa: BLE001 - raised again on the caller's thread
            self.error = e
        finally:
            self.done.set()


class EnergyShare:
    """Shares a total-energy counter (millijoules) among the tickets of each step, equally per
    token processed (prompt and decode tokens alike).

    A thread of its own reads the counter every ENERGY_PERIOD_S while steps run (an NVML read
    can take milliseconds: on the scheduler thread it stalled decode and held each answer's end
    until the next reading). A step's energy is the counter's rise over the step: the readings
    interpolated, past the newest one extrapolated at the power of the last RATE_WINDOW_S; steps
    back to back continue from the value the previous one reached, so the shares add up to the
    counter's rise over a busy spell (a late reading's jump goes to the step that sees it)."""

    def __init__(self, read, clock=time.perf_counter, thread: bool = True):
        self.read, self.clock = read, clock
        self._lock = threading.Lock()
        self._readings: collections.deque = collections.deque(maxlen=256)  # (t, mJ), oldest first
        self._prev = (-math.inf, -math.inf)  # (end, counter value) of the last step shared
        self._busy_until = -math.inf  # readings run often until then
        self._stopped = False
        self._kick = threading.Event()
        self.sample()
        if thread:
            threading.Thread(target=self._run, name="reflex-energy", daemon=True).start()

    def sample(self) -> None:
        t0 = self.clock()
        v = self.read()
        if v is not None:  # stamped mid-read: a read takes milliseconds
            with self._lock:
                self._readings.append(((t0 + self.clock()) / 2, float(v)))

    def _run(self) -> None:
        while not self._stopped:
            if self.clock() > self._busy_until:  # idle: wait for a step (a slow reading keeps the baseline fresh)
                self._kick.wait(IDLE_READ_S)
                self._kick.clear()
            else:
                time.sleep(ENERGY_PERIOD_S)
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - a failed read is a missing reading, not the end of the readings
                pass

    def stop(self) -> None:
        self._stopped = True
        self._kick.set()

    def at(self, t: float) -> float | None:
        """The counter's value at time t, estimated from the readings (None before the first)."""
        with self._lock:
            r = list(self._readings)
        if not r:
            return None
        if t <= r[0][0]:
            return r[0][1]
        if t >= r[-1][0]:
            t_last, v_last = r[-1]
            i = next(i for i, x in enumerate(r) if x[0] >= t_last - RATE_WINDOW_S)
            t_old, v_old = r[min(i, len(r) - 2)] if len(r) > 1 else r[-1]  # one reading in the window: the one before
            rate = (v_last - v_old) / (t_last - t_old) if t_last > t_old else 0.0
            return v_last + rate * (t - t_last)
        i = next(i for i, x in enumerate(r) if x[0] > t)
        (ta, va), (tb, vb) = r[i - 1], r[i]
        return va + (vb - va) * (t - ta) / (tb - ta)

    def share(self, t0: float, t1: float, parts: list) -> None:
        """The energy of a step from t0 to t1 to its (ticket, tokens) parts."""
        if self._busy_until < t0:
            self._kick.set()
        self._busy_until = t1 + 1.0
        end, reached = self._prev
        total = sum(n for _, n in parts)
        a, b = self.at(t0), self.at(t1)
        if not total or a is None:  # no tokens, or no reading yet: the energy goes to the next step
            return
        # back to back: continue the chain; after a gap from where the counter was then (never
        # below what the last step reached: no energy is shared twice)
        v0 = reached if t0 - end < STEP_GAP_S else max(reached, a)
        v1 = max(v0, b)
        self._prev = (t1, v1)
        for ticket, n in parts:
            ticket.mj += (v1 - v0) * n / total


class Scheduler:
    def __init__(self, runner, limits, energy=None, name: str = "reflex-engine"):
        self.runner = runner
        self.batched = getattr(runner, "max_seqs", 1) >= 2
        self.max_seqs = min(limits.max_seqs, runner.max_seqs) if self.batched else 1
        # prompt tokens per step: the limit, or less where the runner's forward is smaller (the numpy
        # runner's 256-token pass keeps the request timeout's overshoot to one short pass)
        self.max_queue = limits.max_queue
        self.chunk = min(limits.prefill_chunk, getattr(runner, "prefill_chunk", limits.prefill_chunk))
        self.energy = EnergyShare(energy) if energy is not None else None
        self.step_log: collections.deque = collections.deque(maxlen=STEP_LOG)  # (prefill, decode) per step
        self._cv = threading.Condition()
        self._waiting: collections.deque = collections.deque()  # Tickets, Scorings and _Calls, in arrival order
        self._running: list[Ticket] = []
        self._mean_s = 1.0  # recent request duration, for Busy's retry_after_s
        self._no_room = False  # the KV cache held back the first in line: free sequences are no room
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # -- any thread ----------------------------------------------------------------------------

    def submit(self, prompt_ids, pick, max_new: int, stop_ids, deadline: float | None = None, gone=None) -> Ticket:
        """A ticket for one generation (engine.Runner.generate_ids's rules); Busy when the queue is
        full. `gone()`: whether its client left, asked while it waits and during its prompt."""
        return self._enqueue(Ticket(list(prompt_ids), pick, max_new, stop_ids, deadline, self._wake, gone))

    def score(self, prompt_ids, candidates) -> tuple[list, dict]:
        """system1's log-probabilities (runner.score's) and the record fields the scheduler adds:
        on a batching runner a Scoring, admitted in turn like a generate request (its cache from
        the same pool) and run beside the others' prompt chunks in one step; else a call between
        requests. Busy when the queue is full."""
        if not self.batched:
            return self.call(lambda: self.runner.score(prompt_ids, candidates)), {}
        job = self._enqueue(Scoring(list(prompt_ids), candidates))
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result, job.stats(self.energy is not None)

    def call(self, fn):
        """fn() on the scheduler thread, between steps; its result (or its exception) here."""
        c = self._enqueue(_Call(fn))
        c.done.wait()
        if c.error is not None:
            raise c.error
        return c.result

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify()

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify()

    def _enqueue(self, job):
        with self._cv:
            if self._stopped:
                raise ReflexError("the engine is shutting down")
            n = len(self._waiting)
            free = 0 if self._no_room else max(0, self.max_seqs - len(self._running))  # they take it at once
            if n >= self.max_queue + free:
                wait = min(60.0, max(1.0, self._mean_s * math.ceil(n / self.max_seqs)))
                raise Busy(f"the server is busy: {n} requests wait for {self.max_seqs} running ones "
                           f"(the queue holds {self.max_queue}); retry in {wait:.0f} s", round(wait, 1))
            self._waiting.append(job)
            self._cv.notify()
        return job

    # -- the scheduler thread ------------------------------------------------------------------

    def _loop(self) -> None:
        bind = getattr(self.runner, "bind_thread", None)  # a CUDA context is current per thread
        if bind is not None:
            bind()
        while True:
            with self._cv:
                while not (self._waiting or self._running or self._stopped):
                    self._cv.wait()
                if self._stopped:
                    break
                job = self._next_job()
            try:
                if isinstance(job, _Call):
                    job.run()
                elif job is not None:
                    self._run_alone(job)
                elif self._running:
                    self._step()
            except Exception as e:  # noqa: BLE001 - a bug or a device fault: no consumer may hang on it
                self._fail_running(e)
        if self.energy is not None:
            self.energy.stop()
        for t in self._running + [j for j in self._waiting if isinstance(j, _Request)]:
            t.end(ReflexError("the engine is shutting down"))
        for c in self._waiting:
            if isinstance(c, _Call):
                c.error = ReflexError("the engine is shutting down")
                c.done.set()

    def _fail_running(self, e: Exception) -> None:
        """Every running request ends with `e`; waiting ones stay (each meets the fault itself, or
        is served if it was one request's)."""
        for t in list(self._running):
            self._retire(t, ended=True, quiet=True)
            t.end(e)

    def _next_job(self):
        """(under the lock) A call to run now, a ticket to run alone (no batch API), or None after
        admitting what fits into the batch."""
        now = time.perf_counter()
        for job in list(self._waiting):
            if isinstance(job, _Call):
                self._waiting.remove(job)
                return job
            if job.abandoned() or (job.deadline is not None and now > job.deadline):
                self._waiting.remove(job)
                self._timed_out(job) if not job.cancelled else job.end()
        while self._waiting and len(self._running) < self.max_seqs:
            t = self._waiting.popleft()
            t.t_admit = now
            if not self.batched:
                return t
            try:
                if isinstance(t, Scoring):
                    t.sid = self.runner.batch_open_score(t.prompt, t.candidates)
                else:
                    t.sid = self.runner.batch_open(t.prompt, t.pick, t.max_new, t.stop_ids)
                self._no_room = False
            except NoRoom as e:  # the KV cache is full: it waits, first in line, for running ones to end
                if not self._running:  # nothing will give blocks back (the runner admits one of any size)
                    t.end(e)
                    continue
                t.t_admit = None
                self._waiting.appendleft(t)
                self._no_room = True
                break
            except Exception as e:  # noqa: BLE001 - the request's error (RequestError: over the context)
                t.end(e)
                continue
            self._running.append(t)
        return None

    def _timed_out(self, t: Ticket) -> None:
        t.end(RequestTimeout(f"deadline passed after {t.fed} of {len(t.prompt)} prompt tokens"))

    def _step(self) -> None:
        now = time.perf_counter()
        for t in list(self._running):  # cancelled, or past the deadline still in the prompt
            if t.abandoned() or (t.deadline is not None and now > t.deadline and t.fed < len(t.prompt)):
                # its consumer may still wait (a client that left before its first token): end it
                # after freeing the sequence, with the timeout when that is why
                self._retire(t, ended=True)
                self._timed_out(t) if not t.cancelled else t.end()
        budget, prefill, decode, score = self.chunk, [], [], []
        for t in self._running:
            if isinstance(t, Scoring):  # its whole tree in one step, from the prompt budget
                if budget > 0:
                    score.append(t)
                    budget -= t.n_tokens
            elif t.fed < len(t.prompt):
                if budget > 0:
                    n = min(budget, len(t.prompt) - t.fed)
                    prefill.append((t, n))
                    budget -= n
            else:
                decode.append(t)
        if not prefill and not decode and not score:
            return
        self.step_log.append((tuple((t.sid, n) for t, n in prefill) + tuple((t.sid, t.n_tokens) for t in score),
                              tuple(t.sid for t in decode)))
        t0 = time.perf_counter()
        try:
            out = self.runner.batch_step([(t.sid, n) for t, n in prefill], [t.sid for t in decode],
                                         [t.sid for t in score])
        except Exception as e:  # noqa: BLE001 - every sequence of the step shares the failure
            for t in [t for t, _ in prefill] + decode + score:
                self._retire(t, ended=True, quiet=True)
                t.end(e)
            return
        size = len(prefill) + len(decode) + len(score)
        for t, n in prefill:
            t.fed += n
        self._count(t0, prefill + [(t, len(out.get(t.sid, ()))) for t in decode] + [(t, t.n_tokens) for t in score],
                    size)
        for t in [t for t, _ in prefill] + decode + score:
            toks = out.get(t.sid)
            if toks and t.deliver(toks):
                self._retire(t)

    def _count(self, t0: float, parts: list, size: int) -> None:
        """A step that began at t0 is done: each (ticket, tokens) part took part in a batch of size."""
        for t, _ in parts:
            t.took_part(size)
        if self.energy is not None:
            self.energy.share(t0, time.perf_counter(), parts)

    def _retire(self, t: Ticket, ended: bool = False, quiet: bool = False) -> None:
        """Free its sequence; `ended`: its consumer needs no end (cancelled, or told otherwise);
        `quiet`: after a failure of the runner, whose close may fail the same way."""
        if t in self._running:
            self._running.remove(t)
            try:
                self.runner.batch_close(t.sid)
            except Exception:  # noqa: BLE001
                if not quiet:
                    raise
        self._mean_s = 0.8 * self._mean_s + 0.2 * (time.perf_counter() - t.t_submit)
        if not ended:
            t.end()

    def _run_alone(self, t: Ticket) -> None:
        """A runner without the batch API: its generate_ids, one request at a time, on this thread."""
        p, extra = t.pick, {}
        if p.logprobs is not None:
            extra["logprobs"] = p.logprobs
        if p.constraint is not None:
            extra["constraint"] = p.constraint
        if t.deadline is not None and getattr(self.runner, "checks_deadline", False):
            extra["deadline"] = t.deadline
        gen = self.runner.generate_ids(t.prompt, p.params, t.max_new, t.stop_ids, **extra)
        self._running.append(t)  # holds the one slot (submit counts it)
        try:
            first, t0 = True, time.perf_counter()
            for tok in gen:
                self._count(t0, [(t, len(t.prompt) + 1 if first else 1)], 1)
                first, t0 = False, time.perf_counter()
                if t.cancelled or t.deliver([tok]):
                    break
        except Exception as e:  # noqa: BLE001 - the request's own error (RequestTimeout, a device fault)
            t.end(e)
            return
        finally:
            gen.close()
            self._running.remove(t)
        self._retire(t, ended=t.cancelled)
        if t.cancelled:  # closed by its consumer, or its client left before the first token
            t.end()
