"""The CUDA runner: weights uploaded beside the tokenizer, prefill launched eagerly, and each
decode step replayed from one CUDA graph that needs nothing from the host.

Device-resident state (tokens, positions, cache slots, step counter, sampling settings) lets the
captured step read its input token and position from memory and leave the next ones there; the
host only queues graph launches and reads back one int per token, one step behind the GPU.

The step API (write, prefill, forward, pick, read_back / token, step_graph; gpu/step.py says
what a step is) is what every caller uses: decode() is the one decode loop on it, and bench,
scripts and tests call it; system1 scoring and the check helpers are the runner's own.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from typing import Iterator

from ..engine import Limits
from ..errors import DeviceError, DoesNotFit, RequestError, RequestTimeout
from ..sampling import Sampled, SamplingParams
from ..kvpool import KV_BLOCK, blocks_for
from .launch import Launcher
from .model import MAX_SEQS
from . import score as scoring
from .ops import sample
from .ops.sample import ARGMAX_PARTS, RxSampling, RxState
from .score import MAX_SCORED
from .step import Pick, Seq, Step, int_array
from .residency import WeightStream, on_demand_enabled, plan_upload
from .upload import (MappedFile, StagingRing, default_chunk, default_threads, mapped_enabled, upload_file_range,
                     upload_mapped)

MAX_BATCH = 512  # tokens per forward pass; longer prompts run in chunks
READBACK_SLOTS = 8
AHEAD = 2  # decode steps queued on the GPU beyond the token being read
FIT_HEADROOM = 256 << 20  # + 1% of the GPU + system1's logits: device memory kept free beside the arena (graphs)


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB"


class EagerStep:
    """In place of a decode graph while a MoE file's experts are still uploading
    (gpu/residency.py): launch() runs the step's launches, each MoE layer waiting for its
    routed experts; callers ask for the graph again at their next step."""

    n_nodes = 0

    def __init__(self, body):
        self.body = body

    def launch(self, stream) -> None:
        self.body()


class CudaRunner:
    name = "cuda"
    checks_deadline = True  # generate_ids takes `deadline` (engine.Runner): checked between prefill chunks

    def __init__(self, boot, gguf, config, timeline, model_cls, max_context: int | None = None, max_seqs: int = 1,
                 kv_tokens: int | None = None):
        self.boot = boot
        self.gguf = gguf
        self.config = config
        self.tl = timeline
        self.max_context = max_context or min(config.context_length, 4096)  # per sequence
        self._model_cls = model_cls
        self.kv_tokens = kv_tokens  # the paged cache's pool (None: every sequence at max_context, or what fits)
        self.model = self._plan(min(max_seqs, MAX_BATCH), kv_tokens)  # a decode step's rows must fit the activation buffers
        self.fit_note: str | None = None  # what the plan or _fit changed, for the loader's log
        if kv_tokens and self.model.paged and (held := self.model.pool_blocks[1] * KV_BLOCK) != blocks_for(kv_tokens) * KV_BLOCK:
            self.fit_note = (f"the KV cache holds {held} tokens, not --kv-tokens {kv_tokens}: from one sequence of "
                             f"--ctx to --parallel of them")
        self._batch = None  # gpu/batch.py Batcher, on the first batch_open
        self.error: str | None = None
        self._failure: DeviceError | None = None  # the load's own error, when it raised one
        self.dev = None
        # ("greedy" | "sample" | "forward" | ..., pdl, under REFLEX_ATTN_TC_FROM keys) -> decode graph (_graph_key)
        self._graphs: dict[tuple[str, bool, bool], object] = {}
        self._constrain_bufs = None  # gpu/constrained.py StepBuffers, on the first logprobs or grammar request
        self._big_logits = (0, 0)  # (ptr, rows)
        self.upload_stats: dict = {}  # before the first request: upload_ms covers what it waited for
        self._weights = None  # gpu/residency.py WeightStream (MoE files: experts on demand)
        self.forward_passes = 0
        self.pdl: bool | None = None  # None: chain the decode graph's kernels (PDL) where the GPU can
        self._fused = None  # gpu/fused.py FusedStep, False where the model has none (fused_note says why)
        self._fused_on = None  # the launcher's kernel choices it was built for
        self.fused_note: str | None = None

    def _plan(self, max_seqs: int, pool_tokens: int | None = None):
        """The family's gpu.model.GpuModel for max_seqs sequences (plans only: nothing is on the
        device yet). max_seqs > 1 (serving, a family that batches): a range of max_context logical
        slots (whole blocks) per sequence and range 0 for the runner's own passes (its
        generate_ids and score() between steps; serving scores in a sequence's range, gpu/batch.py), backed by a paged pool of pool_tokens (None or more: max_seqs
        full ranges, all that could be in use; never less than one), kvpool.py."""
        if max_seqs > 1:
            rng = blocks_for(self.max_context) * KV_BLOCK
            full = max_seqs * rng // KV_BLOCK  # more could never be in use
            pool = max(min(blocks_for(pool_tokens) if pool_tokens else full, full), rng // KV_BLOCK)
            n_ctx = rng * (max_seqs + 1)
            m = self._model_cls(self.config, self.gguf, MAX_BATCH, n_ctx, max_new=rng, max_seqs=max_seqs,
                                kv_rows=rng + KV_BLOCK + pool * KV_BLOCK)
            if m.batchable:
                return m
        n_ctx = self.max_context
        return self._model_cls(self.config, self.gguf, MAX_BATCH, n_ctx, max_new=n_ctx)

    def _fit(self, dev) -> None:
        """Before the one device allocation: a paged cache whose pool was not given shrinks to
        what fits in the free memory (less FIT_HEADROOM for graphs and buffers made later), never
        below one sequence of max_context; a plan that cannot fit at all is a DoesNotFit naming
        the sizes (not a bare out-of-memory from the driver)."""
        free, total = dev.mem_info()
        m = self.model
        need, seqs = m.arena_bytes, m.max_seqs
        lim = Limits()  # a system1 call at the default limits allocates its logits rows later
        budget = free - FIT_HEADROOM - total // 100 - 4 * lim.max_candidates * lim.max_candidate_tokens * \
            self.config.vocab_size
        shrink = m.paged and self.kv_tokens is None
        if need <= budget or (need <= free and not shrink):
            return
        if shrink:
            rng = m.range_slots
            lo, hi, best = rng // KV_BLOCK, m.pool_blocks[1] - 1, None  # the arena grows with the pool: the most that fit
            while lo <= hi:
                mid = (lo + hi) // 2
                plan = self._plan(seqs, mid * KV_BLOCK)
                if plan.arena_bytes <= budget:
                    best, lo = plan, mid + 1
                else:
                    hi = mid - 1
            if best is None and (one := self._plan(seqs, rng)).arena_bytes <= free:
                best = one  # one sequence's worth fits, if not with the headroom
            if best is not None:
                tokens = best.pool_blocks[1] * KV_BLOCK
                self.fit_note = (f"the KV cache holds {tokens} tokens for up to {seqs} sequences of up to "
                                 f"{self.max_context} (all {seqs} at full length need {_gb(need)} with the weights, "
                                 f"and {_gb(free)} of GPU memory is free): requests wait for room when it is full")
                self.model = best
                return
            need = one.arena_bytes  # not even one sequence: say what one needs
        w = self.model.weights_bytes
        what = f"a KV cache of {m.pool_blocks[1] * KV_BLOCK} tokens" if self.kv_tokens and m.paged else \
            f"caches for {'one sequence' if m.paged else f'{seqs} sequence(s)'} of {self.max_context} tokens"
        hint = "--kv-tokens / REFLEX_KV_TOKENS or --ctx / REFLEX_CTX" if self.kv_tokens and m.paged else \
            "--ctx / REFLEX_CTX"
        raise DoesNotFit(f"the model needs {_gb(need)} of GPU memory ({_gb(w)} of weights, {_gb(need - w)} of "
                         f"{what} and buffers); {_gb(free)} of {_gb(total)} is free: lower {hint}")

    @classmethod
    def start(cls, boot, gguf, config, timeline, model_cls, max_context: int | None = None,
              max_seqs: int = 1, kv_tokens: int | None = None) -> "CudaRunner":
        r = cls(boot, gguf, config, timeline, model_cls, max_context, max_seqs, kv_tokens)
        r._thread = threading.Thread(target=r._load, name="reflex-upload", daemon=True)
        r._thread.start()
        return r

    # -- loading (background thread) -----------------------------------------------------------

    def _load(self) -> None:
        mapped = None
        try:
            plan = plan_upload(self.gguf) if on_demand_enabled() else None  # its ring stages bigger packs
            if plan is None and mapped_enabled():  # the mapping's page tables filled while the device comes up
                t = self.tl.elapsed()
                try:
                    mapped = MappedFile(self.gguf.path, self.gguf.data_offset + self.model.weights_bytes)
                except OSError:  # no mapping here: the staging ring instead
                    mapped = None
                else:
                    self.tl.span("weights_map", t, self.tl.elapsed())
            dev = self.boot.wait()
            if dev is None:
                self.error = self.boot.error
                return
            tl = self.tl
            t = tl.elapsed()
            self._fit(dev)
            base = dev.alloc(self.model.arena_bytes)
            ring = StagingRing(dev, default_threads(), default_chunk(on_demand=plan is not None))
            tl.span("device_alloc", t, tl.elapsed())
            t = tl.elapsed()
            dst = base + self.model.arena.offsets["weights"]
            if mapped is not None:  # dense, REFLEX_UPLOAD_MAPPED=1: from the mapping, a few driver calls a thread
                upload_mapped(dev, mapped, self.gguf.data_offset, self.model.weights_bytes, dst, ring.n_threads)
            elif plan is None:  # dense: the whole region in file order
                upload_file_range(dev, ring, self.gguf.path, self.gguf.data_offset, self.model.weights_bytes, dst)
            else:  # the routed experts on demand, then behind the first forward (gpu/residency.py)
                self._weights = WeightStream(dev, ring, self.gguf.path, self.gguf.data_offset, dst, plan, tl)
                self._weights.load_base()
            t_end = tl.elapsed()
            tl.span("weights_upload", t, t_end)
            up = self.model.weights_bytes if plan is None else self._weights.stats["base_loaded_bytes"]
            self.upload_stats = {"weights_bytes": self.model.weights_bytes, "upload_ms": round((t_end - t) * 1000, 3),
                                 "upload_gb_s": round(up / max(t_end - t, 1e-9) / 1e9, 2),
                                 "upload_threads": ring.n_threads, "upload_chunk_mb": ring.chunk / (1 << 20),
                                 "upload_mode": "mapped" if mapped is not None else "staged"}
            self.stream = self.boot.stream
            self.launch = Launcher(dev, self.stream)
            self.model.bind(base, self.launch)
            self.model.residency = self._weights
            # Small pinned buffers for request inputs and token read-back. Layout in ints:
            # tokens | pos | slot | seg_lo (cap each) | n_kv, step, pad, pad | sampling (8) | scoring | seq_start
            self._cap = max(self.max_context, MAX_BATCH)
            self._seq_at = 4 * self._cap + 16 + 3 * MAX_SCORED
            self._in_ptr, self._in_view = dev.alloc_pinned(4 * (self._seq_at + MAX_SEQS + 1))
            self._in_ev = dev.event()
            dev.record(self._in_ev, self.stream)
            self._rb_ptr, self._rb_view = dev.alloc_pinned(4 * READBACK_SLOTS)
            self._rb_events = [dev.event() for _ in range(READBACK_SLOTS)]
            d = self.model
            self._state = RxState(d.p("tokens"), d.p("pos"), d.p("slot"), d.p("n_kv"), d.p("step"), d.p("out_tokens"))
            self.dev = dev
        except DeviceError as e:  # raised as is (a DoesNotFit stays one: the loader keeps off the CPU for it)
            self.error, self._failure = str(e), e
        except Exception as e:  # surfaced to the main thread as one line
            self.error = f"GPU load failed: {type(e).__name__}: {' '.join(str(e).split())}"
        finally:
            if mapped is not None:  # the copies are done (or failed): nothing reads the mapping again
                mapped.close()

    def wait_ready(self) -> None:
        self._thread.join()
        if self.error:
            raise self._failure or DeviceError(self.error)
        self.dev.make_current()
        self.tl.mark("weights_uploaded")

    def bind_thread(self) -> None:
        """Make the context current on the calling thread: the scheduler's (scheduler.py)."""
        self.dev.make_current()

    def info(self) -> dict:
        dev = self.dev
        out = {"device": dev.name if dev else None,
               "compute_capability": f"{dev.cc[0]}.{dev.cc[1]}" if dev else None,
               "kernel_format": self.boot.kernel_format, "context": self.max_context}
        out.update(self.upload_stats)
        if self._weights is not None:
            out.update(self._weights.stats)
        if self._fused is not None:
            out["decode_fused_step"] = bool(self._fused) or self.fused_note
        for (_, pdl, _), g in list(self._graphs.items()):  # the scheduler thread may add one meanwhile
            out["decode_graph_nodes"] = g.n_nodes
            out["decode_graph_pdl"] = pdl
        return out

    # -- inputs ------------------------------------------------------------------------------

    def write_inputs(self, tokens, pos, slot, seg_lo=None, n_kv: int = 0, sampling: SamplingParams | None = None,
                      seq_start=None, first: int = 0, step: int | None = 0) -> None:
        """Copy per-token inputs to the device state from index `first` (and n_kv, the step
        counter unless `step` is None, sampling settings, the starts of a forked batch's sequences)."""
        n = len(tokens)
        cap = self._cap
        if n > cap:
            raise RequestError(f"{n} tokens exceed the context of {self.max_context}")
        ints = self._pinned().cast("i")
        d, dev, s = self.model, self.dev, self.stream
        for k, arr in enumerate((tokens, pos, slot, seg_lo or ())):
            ints[k * cap:k * cap + len(arr)] = int_array(arr)
        scalars = 4 * cap  # n_kv, step
        ints[scalars] = n_kv or max(slot) + 1
        ints[scalars + 1] = step or 0
        for k, name in enumerate(("tokens", "pos", "slot", "seg_lo")):
            if k == 3 and not seg_lo:
                continue
            dev.htod(d.p(name) + 4 * first, self._in_ptr + 4 * k * cap, 4 * n, s)
        dev.htod(d.p("n_kv"), self._in_ptr + 4 * scalars, 4, s)
        if step is not None:
            dev.htod(d.p("step"), self._in_ptr + 4 * (scalars + 1), 4, s)
        if sampling is not None:
            sp = RxSampling.from_address(self._in_ptr + 4 * (scalars + 4))
            sp.temperature, sp.top_k, sp.top_p = sampling.temperature, sampling.top_k, sampling.top_p
            sp.min_p = sampling.min_p
            sp.seed = (sampling.seed or 0) & 0xFFFFFFFFFFFFFFFF
            dev.htod(d.p("sampling"), self._in_ptr + 4 * (scalars + 4), ctypes.sizeof(RxSampling), s)
        if seq_start is not None:
            ints[self._seq_at:self._seq_at + len(seq_start)] = int_array(seq_start)
            dev.htod(d.p("seq_start"), self._in_ptr + 4 * self._seq_at, 4 * len(seq_start), s)
        dev.record(self._in_ev, s)

    def _pinned(self):
        """The pinned input buffer, once the copies queued from it have run (work queued ahead,
        such as a batch's decode steps, may hold them back)."""
        self.dev.wait_event(self._in_ev)
        return self._in_view

    def pinned_scoring(self):
        """(address, view) of the pinned buffer's part for system1's rows and tokens (gpu/score.py)."""
        at = 4 * (4 * self._cap + 16)
        return self._in_ptr + at, self._pinned()[at:at + 12 * MAX_SCORED]

    def _forward_chunks(self, n: int, logit_rows: int = 1, logits: int = 0, logit_row: int = -1,
                        deadline: float | None = None) -> None:
        """Forward the n input tokens in chunks; the LM head runs on the last chunk only. With a
        deadline (time.perf_counter()), before each chunk, once the previous one has finished on
        the device (launches only queue work): RequestTimeout when it has passed."""
        for c0 in range(0, n, MAX_BATCH):
            if deadline is not None:
                if c0:
                    self.dev.sync(self.stream)
                if time.perf_counter() > deadline:
                    raise RequestTimeout(f"deadline passed after {c0} of {n} prompt tokens")
            m = min(MAX_BATCH, n - c0)
            last = c0 + m >= n
            self.model.forward(m, first=c0, logit_rows=logit_rows if last else 0, logits=logits,
                               logit_row=(logit_row - c0 if logit_row >= 0 else -1))
            self.forward_passes += 1

    # -- the step API: prefill, forward, pick, read back (gpu/step.py says what a step is) ---------
    # One decode loop (decode()) runs every generation on these; `reflex bench`, scripts and the
    # tests call them too. Today a step holds one sequence (the device-side state is one sequence's).

    def write(self, step: Step) -> None:
        """Copy the step's tokens, positions and cache slots to the device (the visible cache:
        up to its last slot), and the sampling settings of a sampled pick. Writing a one-token
        step at position p rewinds the sequence to p (what the benchmarks do between runs)."""
        seq = self._one_sequence(step)
        if seq.tokens is None:
            raise ValueError("write() takes tokens from the host; a decode step's token is on the device")
        pos = list(range(seq.start, seq.start + seq.n))
        slots = list(range(seq.first_slot, seq.first_slot + seq.n))
        sampled = seq.pick is not None and not seq.pick.greedy
        self.write_inputs(seq.tokens, pos, slots, n_kv=slots[-1] + 1, sampling=seq.pick.params if sampled else None)

    def prefill(self, step: Step, deadline: float | None = None) -> None:
        """write(step), then forward its tokens in chunks of MAX_BATCH; each sequence's last row
        leaves its logits for pick(). deadline: checked between chunks (RequestTimeout)."""
        self.write(step)
        self._forward_chunks(step.n_tokens, deadline=deadline)

    def forward(self, step: Step, pdl: bool | None = None, context: int | None = None) -> None:
        """One decode step's forward pass over `step` (one token per sequence, which the previous
        pick left on the device), replayed from its captured graph, without the pick. context: the
        keys it attends to, where the caller knows them (the graph for it: _graph)."""
        seq = self._one_sequence(step)
        assert seq.n == 1 and seq.tokens is None, "forward() runs decode steps; prefill() runs prompts"
        self._graph("forward", lambda: self.model.forward(1, first=0), pdl, context).launch(self.stream)

    def pick(self, step: Step, hooks=()) -> bool:
        """Choose the next token of every sequence of `step` that has a pick, from the logits of its
        last row, and advance the device-side state (token, position, slot, step count). hooks[i]
        (gpu/constrained.py PickHooks, or None) runs around sequence i's pick: statistics of the
        raw logits and the grammar mask before it, the chosen token's logit after. False: the
        grammar allows no token, nothing was picked."""
        seq, (row,) = self._one_sequence(step), step.last_rows()
        h = hooks[0] if hooks else None
        if seq.pick is None:
            return True
        if h is not None and not h.before(self.model.p("logits")):
            return False
        self._pick(seq.pick.greedy, row)
        if h is not None:
            h.after(self.model.p("logits"))
        return True

    def pick_hooks(self, pick: Pick, tokens_ptr: int = 0):
        """The hooks a logprobs or grammar pick needs (None for a plain one), on this runner's
        step buffers (allocated on first use); the pick leaves its token at tokens_ptr (default:
        the first decode row's)."""
        if not pick.hooked:
            return None
        from .constrained import PickHooks, StepBuffers

        if self._constrain_bufs is None:
            self._constrain_bufs = StepBuffers(self.dev, self.config.vocab_size)
        return PickHooks(self.launch, self.dev, self.stream, tokens_ptr or self.model.p("tokens"),
                         self.config.vocab_size, self._constrain_bufs, pick)

    def step_graph(self, greedy: bool, pdl: bool | None = None, rows: bool = False, context: int | None = None):
        """A decode step (forward + the plain pick, fused into the LM head for greedy decoding
        where the head can) as one CUDA graph, captured on first use. Its kernels are chained as
        programmatic dependent launches where the GPU has them (sm_90+): each one's launch then
        overlaps its predecessor's tail. REFLEX_PDL=0 turns that off (bench compares). rows: the
        token is a batched sequence's one decode row, its keys from its seg_lo (gpu/batch.py).
        context: the keys the step attends to (_graph: a long one's graph may take other kernels)."""
        kind = ("row1-" if rows else "") + ("greedy" if greedy else "sample")
        if not rows and self._graph_key(kind, pdl, context) not in self._graphs:
            self._prepare_fused()  # uploads its program: not while capturing
        return self._graph(kind, lambda: self._step(greedy, rows), pdl, context)

    def _prepare_fused(self) -> None:
        """The fused decode step (gpu/fused.py), or why not (kept in self.fused_note)."""
        from .fused import FusedStep, Unfusable  # not on the cold path: the first token comes from prefill
        from .launch import FUSED_KNOBS

        L = self.launch
        # what the program or its launch depends on: the bench switches these between graphs
        knobs = (L.staged, L.attn_decode, L.fuse_rope, L.fused_step, L.attn_head_groups, L.attn_min_keys) + tuple(
            getattr(L, k) for k in FUSED_KNOBS)
        if self._fused is not None and self._fused_on == knobs:
            return
        self._fused_on = knobs
        try:
            self._fused, self.fused_note = FusedStep.build(self.model, self._state), None
        except Unfusable as e:
            self._fused, self.fused_note = False, str(e)

    def read_back(self, i: int) -> None:
        """Queue the copy of the current token (the i-th picked) to the host, behind the work
        queued so far (slot i % READBACK_SLOTS)."""
        k = i % READBACK_SLOTS
        self.dev.dtoh(self._rb_ptr + 4 * k, self.model.p("tokens"), 4, self.stream)
        self.dev.record(self._rb_events[k], self.stream)

    def token(self, i: int) -> int:
        """The i-th picked token, once its read-back has landed (waits for it)."""
        k = i % READBACK_SLOTS
        self.dev.wait_event(self._rb_events[k])
        return self._rb_view.cast("i")[k]

    def decode(self, step: Step, max_new: int, stop_ids, deadline: float | None = None) -> Iterator[int | Sampled]:
        """The decode loop: prefill `step` (a sequence's prompt, with its pick), pick the first
        token, then one forward and pick per token until a stop id or max_new tokens. A plain pick
        replays one graph per token (forward + pick) with AHEAD steps queued on the GPU; a hooked
        pick (logprobs, a grammar) waits for each token before it queues the next step (the mask
        depends on it) and yields Sampled with logprobs. A grammar that allows nothing ends it; a
        deadline that passes during the prefill raises RequestTimeout."""
        seq = self._one_sequence(step)
        pick = seq.pick
        keys = (seq.start or 0) + seq.n  # the prompt's: token q's step attends to keys + q of them
        hooks = [self.pick_hooks(pick)] if pick.hooked else []
        nxt = Step.of(Seq.decode(pick))  # every later step: one device-held token
        try:
            self.prefill(step, deadline)
            if not self.pick(step, hooks):
                return
            self.read_back(0)
            graph, queued = None, 1  # tokens whose computation is on the stream
            for i in range(max_new):
                tok = self.token(i)
                yield hooks[0].result(tok) if hooks else tok  # the first one is the first token: nothing may delay it
                if tok in stop_ids or i + 1 >= max_new:
                    return
                if hooks:
                    self.forward(nxt, context=keys + i + 1)
                    if not self.pick(nxt, hooks):
                        return
                    self.read_back(i + 1)
                    continue
                while queued < min(i + 2 + AHEAD, max_new):
                    # a graph once every expert is resident; another one past REFLEX_ATTN_TC_FROM keys
                    if graph is None or isinstance(graph, EagerStep) or self.launch.attn_tc:
                        graph = self.step_graph(pick.greedy, context=keys + queued)
                    graph.launch(self.stream)
                    self.read_back(queued)
                    queued += 1
        finally:
            self.dev.sync(self.stream)  # nothing in flight touches the inputs of the next request

    # -- the batch API (the engine's scheduler; gpu/batch.py does the work) ----------------------

    @property
    def max_seqs(self) -> int:
        """Sequences decoded together: the pool's ranges, when the family's layers can batch."""
        return self.model.max_seqs if self.model.batchable else 1

    def batch_open(self, prompt_ids, pick: Pick, max_new: int, stop_ids) -> int:
        return self._batcher().open(prompt_ids, pick, max_new, stop_ids)

    def batch_open_score(self, prompt_ids, candidates) -> int:
        return self._batcher().open_score(prompt_ids, candidates)

    def _batcher(self):
        if self._batch is None:
            from .batch import Batcher

            self._batch = Batcher(self)
        return self._batch

    def batch_step(self, prefill, decode, score=()) -> dict:
        return self._batch.step(prefill, decode, score)

    def batch_close(self, sid: int) -> None:
        self._batch.close(sid)

    @property
    def energy_counter(self):
        """NVML's total-energy counter of this GPU in millijoules (the scheduler shares it out
        among requests), or None where the GPU has none."""
        m = getattr(self.tl, "meter", None)
        return m.counter_mj if m is not None and m.method == "total_energy_counter" else None

    def graph(self, kind: str, body, context: int | None = None):
        """A decode graph captured once per kind (and side of REFLEX_ATTN_TC_FROM: _graph_key) from
        body() (PDL where the GPU has it)."""
        return self._graph(kind, body, None, context)

    def read_token(self, ptr: int) -> int:
        """One int from the device, after the work queued before it."""
        self.dev.dtoh(self._rb_ptr, ptr, 4, self.stream)
        self.dev.sync(self.stream)
        return self._rb_view.cast("i")[0]

    def _one_sequence(self, step: Step) -> Seq:
        if len(step.seqs) != 1:
            raise ValueError(f"a step of {len(step.seqs)} sequences: this runner holds one (batching is issue 32)")
        return step.seqs[0]

    def _pick(self, greedy: bool, last: int) -> None:
        d = self.model
        if greedy:
            sample.argmax(self.launch, d.p("logits"), self.config.vocab_size, d.p("amax_v"), d.p("amax_i"),
                          ARGMAX_PARTS, self._state, last)
        else:
            sample.sample(self.launch, d.p("logits"), self.config.vocab_size, d.p("sampling"), self._state, last)

    def resident(self) -> bool:
        """Every weight on the device (MoE files upload experts behind the first forward)."""
        return self._weights is None or self._weights.complete

    def wait_weights(self) -> None:
        """Return once every weight is on the device (before warm benchmarks)."""
        if self._weights is not None:
            self._weights.wait_all()

    def _graph_key(self, kind: str, pdl: bool | None, context: int | None) -> tuple:
        """A decode graph's key: with the tensor-core attention on (REFLEX_ATTN_TC), a step over
        fewer than L.attn_tc_from keys has a graph of its own, with the tile kernels in it."""
        pdl = self.pdl_available() if pdl is None else pdl
        return kind, pdl, self.launch.attn_tc and self.launch.attn_short_for(context)

    def _graph(self, kind: str, body, pdl: bool | None, context: int | None = None):
        """The captured graph of body(), for a step over `context` keys (None: any; _graph_key);
        while experts are still uploading, an EagerStep that runs body() itself (a graph's forward
        cannot wait for the experts its tokens route to)."""
        key = self._graph_key(kind, pdl, context)
        pdl = key[1]
        g = self._graphs.get(key)
        if g is None:
            if context is not None:  # captured (or run eagerly) with the attention for that context
                inner, L = body, self.launch

                def body():
                    with L.attn_context(context):
                        inner()
            if not self.resident():
                self._weights.check()  # a failed upload never completes: say so instead of running eagerly on
                return EagerStep(body)
            dev, s = self.dev, self.stream
            dev.begin_capture(s)
            self.launch.pdl = pdl
            try:
                body()
            finally:
                self.launch.pdl = False
                g = dev.end_capture(s)
            self._graphs[key] = g
        return g

    def reset_graphs(self) -> None:
        """Drop the captured decode graphs (after changing which kernels the launcher picks)."""
        self._graphs.clear()

    def _step(self, greedy: bool, rows: bool = False) -> None:
        """One decode step: the forward pass of tokens[0], then the pick (fused into the LM head
        for greedy decoding where the head can); where the model allows, all of it is one
        persistent kernel (gpu/fused.py), the sampler after it."""
        if not rows and self._fused:
            self._fused.launch(greedy)
            if not greedy:
                self._pick(False, 0)
            return
        if not self.model.forward(1, first=0, pick=(self._state, 0) if greedy else None, rows=rows):
            self._pick(greedy, 0)

    def pdl_available(self) -> bool:
        if self.pdl is not None:
            return self.pdl
        return self.dev.cc >= (9, 0) and os.environ.get("REFLEX_PDL", "1") != "0"

    # -- the Runner interface --------------------------------------------------------------------

    def generate_ids(self, prompt_ids, params: SamplingParams, max_new: int, stop_ids, logprobs: int | None = None,
                     constraint=None, deadline: float | None = None) -> Iterator[int | Sampled]:
        """engine.Runner.generate_ids: one sequence through decode()."""
        n = len(prompt_ids)
        if n + max_new > self.max_context:
            raise RequestError(f"prompt ({n}) + max_tokens ({max_new}) exceed the context of {self.max_context}")
        yield from self.decode(Step.of(Seq.prompt(prompt_ids, pick=Pick(params, logprobs, constraint))), max_new,
                               stop_ids, deadline)

    def score(self, prompt_ids, candidates) -> list[list[float]]:
        """system1 in the runner's own place (gpu/score.py); a batch's sequences keep theirs."""
        if self._batch is not None:  # sequences may be decoding: their state and ranges stay theirs
            self._batch.pause()
        return scoring.score(self, prompt_ids, candidates)

    # -- device buffers system1 scoring grows on demand (gpu/score.py) ---------------------------

    def scratch(self, n_ints: int) -> int:
        """At least n_ints device ints (the rows, tokens and results of a log-probability gather)."""
        ptr, cap = getattr(self, "_scratch_buf", (0, 0))
        if cap < n_ints:
            if ptr:
                self.dev.sync(self.stream)  # no kernel queued earlier may still read the old buffer
                self.dev.free(ptr)
            ptr = self.dev.alloc(4 * n_ints)
            self._scratch_buf = (ptr, n_ints)
        return ptr

    def logits_buffer(self, rows: int) -> int:
        """At least `rows` rows of logits (system1's: more than the decode rows' buffer holds)."""
        ptr, have = self._big_logits
        if have < rows:
            if ptr:
                self.dev.sync(self.stream)  # no kernel queued earlier may still write the old buffer
                self.dev.free(ptr)
            ptr = self.dev.alloc(4 * rows * self.config.vocab_size)
            self._big_logits = (ptr, rows)
        return ptr

    # -- for `reflex bench` (warm measurements, not the serving path) ----------------------------

    def prefill_greedy(self, ids) -> None:
        """Enqueue the prefill of `ids` and the greedy pick of the next token."""
        step = Step.of(Seq.prompt(ids, pick=Pick()))
        self.prefill(step)
        self.pick(step)

    def decode_step_launches(self, context: int) -> list:
        """Prefill `context` tokens, then run one greedy decode step recording its launches
        (gpu.launch.Launch: kernel, grid, arguments, the role its block gave it, weight bytes),
        so a benchmark can replay each role over every layer on its own."""
        self.prefill_greedy([(7 * i + 11) % min(self.config.vocab_size, 1000) + 1 for i in range(context)])
        with self.launch.record() as launches, self.launch.attn_context(context + 1):
            if not self.model.forward(1, pick=(self._state, 0)):
                with self.launch.role("pick (argmax)"):
                    self._pick(True, 0)
        self.dev.sync(self.stream)
        return launches

    def prefill_launches(self, n: int) -> list:
        """The launches of one n-token prefill and its pick, recorded as decode_step_launches'
        (the bench replays the prompt's roles one by one)."""
        ids = [(7 * i + 11) % min(self.config.vocab_size, 1000) + 1 for i in range(n)]
        self.prefill_greedy(ids)  # warm
        with self.launch.record() as launches:
            self.prefill_greedy(ids)
        self.dev.sync(self.stream)
        return launches

    def graph_of(self, launches, pdl: bool = False):
        """A CUDA graph replaying recorded launches in order (no Python in the timed path); pdl:
        chained as programmatic dependent launches, as in the decode graph."""
        self.wait_weights()
        dev, s = self.dev, self.stream
        dev.begin_capture(s)
        try:
            for ln in launches:
                ln.kernel.launch(ln.grid, ln.block, ln.args, s, shmem=ln.shmem, pdl=pdl,
                                 carveout=self.launch.carveout if pdl else None)
        finally:
            graph = dev.end_capture(s)
        return graph

    # -- for `reflex check` and the GPU tests (numpy is fine here: not the cold path) -----------

    def prompt_logits(self, ids):
        """Logits at every prompt position, as a float32 array (n, vocab)."""
        import numpy as np

        n = len(ids)
        pos = list(range(n))
        self.write_inputs(ids, pos, pos, n_kv=n)
        logits = self.logits_buffer(n)
        for c0 in range(0, n, MAX_BATCH):
            m = min(MAX_BATCH, n - c0)
            self.model.forward(m, first=c0, logit_row=0, logit_rows=m, logits=logits + 4 * c0 * self.config.vocab_size)
        return self._fetch(logits, (n, self.config.vocab_size), np)

    def decode_logits(self, ids, forced):
        """Prefill `ids`, then feed each token of `forced` through the single-token (decode)
        path (gpu/fused.py's kernel where the decode graph runs it); returns the logits after the prompt and after each forced token."""
        import numpy as np

        n = len(ids)
        self._prepare_fused()  # the step the decode graph runs: the fused kernel where there is one
        self.prefill(Step.of(Seq.prompt(ids)))
        out = [self._fetch(self.model.p("logits"), (self.config.vocab_size,), np)]
        for j, tok in enumerate(forced):
            self.write(Step.of(Seq.prompt([tok], start=n + j)))
            if self._fused:
                self._fused.launch(greedy=False)
            else:
                with self.launch.attn_context(n + j + 1):
                    self.model.forward(1, first=0)
            out.append(self._fetch(self.model.p("logits"), (self.config.vocab_size,), np))
        return out

    def fused_profile(self, repeats: int = 20) -> list[dict] | None:
        """gpu/fused.py's per-op profile of one decode step (reflex bench); None without the fused step."""
        import numpy as np

        self._prepare_fused()
        if not self._fused:
            return None
        return self._fused.profile(lambda ptr, n: self._fetch(ptr, (n,), np, np.uint64), repeats)

    def _fetch(self, dptr, shape, np, dtype=None):
        count = 1
        for s in shape:
            count *= s
        host = np.empty(shape, dtype=dtype or np.float32)
        self.dev.sync(self.stream)
        from cuda.bindings import driver as cu

        from .driver import check

        check(cu.cuMemcpyDtoH(host.ctypes.data, dptr, host.itemsize * count), "cuMemcpyDtoH")
        return host

