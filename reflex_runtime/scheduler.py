"""One scheduler per engine: continuous batching's host side, shared by every serving front end.

ONE thread owns the runner. Requests are submitted from any thread: a generate request becomes a
`Ticket` (an iterator over its tokens, consumed on the caller's thread); a system1 request a call
run on the scheduler thread between steps. Each loop iteration admits waiting tickets into free
sequence slots (FIFO), runs one `runner.batch_step` (prompt chunks, at most `prefill_chunk` tokens
in all, beside one decode token for every running sequence), hands each ticket its tokens and
retires the finished and the cancelled (a consumer that closes its ticket frees the slot at the
next step). A runner without the batch API (`max_seqs` < 2) runs one request at a time through
its `generate_ids` on the same thread. docs/INTERNALS.md "Scheduler" has the runner contract.
"""

from __future__ import annotations

import collections
import math
import queue
import threading
import time

from .errors import Busy, ReflexError, RequestTimeout
from .sampling import Sampled

ENERGY_PERIOD_S = 0.02  # the energy counter is read at most this often (NVML's ticks are ~20-100 ms)
STEP_LOG = 1024  # steps kept in Scheduler.step_log


class Ticket:
    """One generate request. The scheduler thread writes its progress and stats; the consumer
    iterates its tokens (int, or Sampled with logprobs) and may close() it at any time."""

    def __init__(self, prompt, pick, max_new, stop_ids, deadline, wake, gone=None):
        self.prompt, self.pick, self.max_new, self.stop_ids, self.deadline = prompt, pick, max_new, stop_ids, deadline
        self.cancelled = False
        self.gone = gone  # the front end's "client left" check, asked until the first token
        self.sid = None
        self.fed = self.n_out = 0  # prompt tokens forwarded, tokens picked
        self.t_submit = time.perf_counter()
        self.t_admit = self.t_first = None
        self.sizes = [0, 0, 0, 0]  # batch sizes of its steps: count, min, max, sum
        self.mj = 0.0  # attributed energy, millijoules
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

    def stats(self, energy: bool) -> dict:
        """The record fields the scheduler adds (docs/INTERNALS.md, "The request record")."""
        n, lo, hi, total = self.sizes
        ms = lambda a, b: round((b - a) * 1000, 3) if a is not None and b is not None else None  # noqa: E731
        return {"queue_wait_ms": ms(self.t_submit, self.t_admit), "prefill_ms": ms(self.t_admit, self.t_first),
                "batch_sizes": {"min": lo, "max": hi, "mean": round(total / n, 3)} if n else None,
                "joules_attributed": round(self.mj / 1000, 6) if energy else None}

    # -- the scheduler's side --------------------------------------------------------------------

    def took_part(self, size: int) -> None:
        s = self.sizes
        s[1] = size if s[0] == 0 else min(s[1], size)
        s[2] = max(s[2], size)
        s[0] += 1
        s[3] += size

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
    """Shares a total-energy counter's increments (millijoules) among the tickets that ran in each
    interval, equally per token processed (prompt and decode tokens alike)."""

    def __init__(self, read):
        self.read = read
        self.t, self.mj = time.perf_counter(), read()
        self.tokens: dict = {}

    def add(self, ticket: Ticket, n: int) -> None:
        self.tokens[ticket] = self.tokens.get(ticket, 0) + n

    def wait_s(self) -> float:
        return max(0.0, ENERGY_PERIOD_S - (time.perf_counter() - self.t))

    def sample(self) -> None:
        mj = self.read()
        total = sum(self.tokens.values())
        for ticket, n in self.tokens.items():
            ticket.mj += (mj - self.mj) * n / total
        self.t, self.mj, self.tokens = time.perf_counter(), mj, {}


class Scheduler:
    def __init__(self, runner, limits, energy=None, name: str = "reflex-engine"):
        self.runner = runner
        self.batched = getattr(runner, "max_seqs", 1) >= 2
        self.max_seqs = min(limits.max_seqs, runner.max_seqs) if self.batched else 1
        self.max_queue, self.chunk = limits.max_queue, limits.prefill_chunk
        self.energy = EnergyShare(energy) if energy is not None else None
        self.step_log: collections.deque = collections.deque(maxlen=STEP_LOG)  # (prefill, decode) per step
        self._cv = threading.Condition()
        self._waiting: collections.deque = collections.deque()  # Tickets and _Calls, in arrival order
        self._running: list[Ticket] = []
        self._unsettled: list[Ticket] = []  # retired, ended once the next energy sample shared its interval
        self._mean_s = 1.0  # recent request duration, for Busy's retry_after_s
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # -- any thread ----------------------------------------------------------------------------

    def submit(self, prompt_ids, pick, max_new: int, stop_ids, deadline: float | None = None, gone=None) -> Ticket:
        """A ticket for one generation (engine.Runner.generate_ids's rules); Busy when the queue is
        full. `gone()`: whether its client left, asked while it waits and during its prompt."""
        return self._enqueue(Ticket(list(prompt_ids), pick, max_new, stop_ids, deadline, self._wake, gone))

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
            if n >= self.max_queue + max(0, self.max_seqs - len(self._running)):  # free slots take it at once
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
                while not (self._waiting or self._running or self._unsettled or self._stopped):
                    self._cv.wait()
                if self._stopped:
                    break
                if not (self._waiting or self._running):  # only energy to settle
                    self._cv.wait(self.energy.wait_s())
                job = self._next_job()
            try:
                if isinstance(job, _Call):
                    job.run()
                elif job is not None:
                    self._run_alone(job)
                elif self._running:
                    self._step()
                self._settle()
            except Exception as e:  # noqa: BLE001 - a bug or a device fault: no consumer may hang on it
                self._fail_running(e)
        for t in self._running + self._unsettled + [j for j in self._waiting if isinstance(j, Ticket)]:
            t.end(ReflexError("the engine is shutting down"))
        for c in self._waiting:
            if isinstance(c, _Call):
                c.error = ReflexError("the engine is shutting down")
                c.done.set()

    def _fail_running(self, e: Exception) -> None:
        """Every running and unsettled request ends with `e`; waiting ones stay (each meets the
        fault itself, or is served if it was one request's)."""
        for t in list(self._running):
            self._retire(t, ended=True, quiet=True)
            t.end(e)
        for t in self._unsettled:
            t.end(e)
        self._unsettled.clear()

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
                t.sid = self.runner.batch_open(t.prompt, t.pick, t.max_new, t.stop_ids)
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
            if t.abandoned() or (t.fed < len(t.prompt) and t.deadline is not None and now > t.deadline):
                # its consumer may still wait (a client that left before its first token): end it
                # after freeing the sequence, with the timeout when that is why
                self._retire(t, ended=True)
                self._timed_out(t) if not t.cancelled else t.end()
        budget, prefill, decode = self.chunk, [], []
        for t in self._running:
            if t.fed < len(t.prompt):
                if budget > 0:
                    n = min(budget, len(t.prompt) - t.fed)
                    prefill.append((t, n))
                    budget -= n
            else:
                decode.append(t)
        if not prefill and not decode:
            return
        self.step_log.append((tuple((t.sid, n) for t, n in prefill), tuple(t.sid for t in decode)))
        try:
            out = self.runner.batch_step([(t.sid, n) for t, n in prefill], [t.sid for t in decode])
        except Exception as e:  # noqa: BLE001 - every sequence of the step shares the failure
            for t in [t for t, _ in prefill] + decode:
                self._retire(t, ended=True, quiet=True)
                t.end(e)
            return
        size = len(prefill) + len(decode)
        for t, n in prefill:
            t.fed += n
            self._count(t, n, size)
        for t in decode:
            self._count(t, len(out.get(t.sid, ())), size)
        for t in [t for t, _ in prefill] + decode:
            toks = out.get(t.sid)
            if toks and t.deliver(toks):
                self._retire(t)

    def _count(self, t: Ticket, n: int, size: int) -> None:
        t.took_part(size)
        if self.energy is not None:
            self.energy.add(t, n)

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
        if ended:
            return
        if self.energy is None:
            t.end()
        else:
            self._unsettled.append(t)

    def _settle(self) -> None:
        if self.energy is not None and self.energy.wait_s() == 0:
            self.energy.sample()
            for t in self._unsettled:
                t.end()
            self._unsettled.clear()

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
            first = True
            for tok in gen:
                self._count(t, len(t.prompt) + 1 if first else 1, 1)
                first = False
                if t.cancelled or t.deliver([tok]):
                    break
                self._settle()
        except Exception as e:  # noqa: BLE001 - the request's own error (RequestTimeout, a device fault)
            t.end(e)
            return
        finally:
            gen.close()
            self._running.remove(t)
        self._retire(t, ended=t.cancelled)
        if t.cancelled:  # closed by its consumer, or its client left before the first token
            t.end()
