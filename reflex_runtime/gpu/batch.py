"""Continuous batching on the CUDA runner: the runner's batch API (batch_open, batch_step,
batch_close; the engine's scheduler drives it, reflex_runtime/scheduler.py).

Each sequence sees a range of R >= `max_context` logical cache slots (sequence i: slots (i+1)*R ..
(i+1)*R + R - 1; range 0 stays the runner's own, for its generate_ids and a score() called on the
runner between steps: pause() first lands the queued steps and marks the decode rows for
rewriting, which scoring overwrites). The memory behind a range is paged (kvpool.py): open()
takes blocks for the prompt + max_tokens from the pool sized at load and maps the range's first
slots to them in the block table the attention kernels read (GpuModel.kv_table; unmapped slots
point at a spare block), close() gives them back; a pool too full for a request is NoRoom, and the
scheduler keeps it waiting. A system1 request is a sequence too (open_score: blocks for its tree),
scored within one step (gpu/score.py at state index max_seqs in its range) and closed. A step:
- prompt chunks at state index max_seqs..: where the model packs prompts (attention-only
  families, GpuModel.packs_prompts) the step's chunks of every sequence share forwards of up to
  max_batch tokens, at absolute slots, each token's attention kept to its range from its seg_lo
  entry (the matrix products then see one large batch, not a few small ones: 4 prompts of 128
  tokens run at pp512's rate, not pp128's); else one sequence at a time, with slots relative to its
  range (Batch.kv_base). The prompts a forward ends pick their first tokens together (the LM head
  over their last rows, reflex_pick_rows), read back at once; a sequence whose pick has hooks
  runs its prompt alone. Then system1 trees the same way, their scores read back;
- one forward over the decode token of every running sequence (rows 0..N-1 of the state
  arrays, Batch.rows: the matrix products see N rows, the decode attention one row per
  sequence from its range's first slot), then reflex_pick_rows picks and advances every row.
  That pass is one captured CUDA graph per N, replayed with AHEAD steps queued on the GPU while
  the set of rows stays the same; N = 1 replays the single-sequence graph (the pick fused into
  the LM head) with the row's range start as its first key.
- a sequence whose pick has hooks (logprobs, a grammar) decodes on its own, one token a step,
  as a one-token prompt chunk followed by the hooked pick (the host takes part in every pick).
When the set of rows changes (a sequence joins or leaves), the queued steps are finished and
their tokens kept (none past a stop id or max_new is returned) before the rows are rewritten.
"""

from __future__ import annotations

import ctypes
from collections import deque
from dataclasses import dataclass, field

from ..errors import RequestError
from ..kvpool import KV_BLOCK, BlockPool
from ..sampling import Sampled
from ..tree import tree_tokens
from . import score as scoring
from .score import Place
from .step import Pick, int_array
from .ops import sample
from .ops.sample import RxRows, RxSampling

AHEAD = 2  # decode steps queued beyond the one being read back (as the single-sequence loop)
PINNED = 4  # input buffers in flight (each reused once its copies have run)
SP = ctypes.sizeof(RxSampling)  # bytes per row of sampling_rows (the kernel's stride)


@dataclass
class _Seq:
    base: int  # its range's first cache slot
    blocks: list  # the pool's blocks behind its first slots
    prompt: list[int]
    pick: Pick
    max_new: int
    stop_ids: frozenset
    fed: int = 0  # prompt tokens forwarded
    out: int = 0  # tokens handed back
    queued: int = 0  # tokens computed or queued (>= out)
    last: int = -1  # the latest token: the next step's input
    ended: bool = False  # a stop id or max_new reached: later tokens are dropped
    hooks: object = None
    sampling: RxSampling = field(default_factory=RxSampling)


@dataclass
class _Scoring:
    """A system1 request for one step (open_score)."""

    base: int
    blocks: list
    prompt: list[int]
    candidates: list[list[int]]


class Batcher:
    """The batch state of one CudaRunner (created once its weights are on the device)."""

    def __init__(self, runner):
        self.r = runner
        m = runner.model
        self.S, self.C, self.vocab = m.max_seqs, runner.max_context, runner.config.vocab_size
        self.R = m.range_slots  # C rounded up to whole blocks
        self.X = self.S  # state index of a prompt chunk's first token (after the decode rows)
        self.pool = BlockPool(*m.pool_blocks)
        self.spare = self.R // KV_BLOCK  # the block unmapped slots point at (GpuModel.bind)
        self.free = list(range(self.S - 1, -1, -1))
        self.seqs: dict[int, _Seq] = {}
        self.rows: list[int] = []  # sequences in decode-row order
        self.inflight: deque = deque()  # (readback slot, rows) per queued decode step
        self.pending: dict[int, list] = {}  # tokens landed outside a step (close), handed out by the next
        self.dirty = False  # the device rows no longer match self.rows
        self.n_launched = 0
        dev = runner.dev
        n_int = 6 * self.S + 4 * m.max_batch + 8 + self.R // KV_BLOCK  # (the last: a range's table entries)
        self._in_bytes = 4 * n_int + SP * (self.S + 1)
        self._in = [dev.alloc_pinned(self._in_bytes) for _ in range(PINNED)]
        self._in_ev = [None] * PINNED
        self._in_at = 0
        self.packs = m.packs_prompts
        self._firsts = dev.alloc_pinned(4 * self.S)  # first tokens, read back in the step
        n_rb = AHEAD + 2
        self._rb = [dev.alloc_pinned(4 * self.S) for _ in range(n_rb)]
        self._rb_ev = [dev.event() for _ in range(n_rb)]
        p = m.p
        self._rows_state = RxRows(p("tokens"), p("pos"), p("slot"), p("steps"))
        ptr, view = self._input()  # recurrent layers see the rows as one-token sequences 0, 1, ..
        view.cast("i")[:self.S + 1] = int_array(range(self.S + 1))
        dev.htod(p("row_start"), ptr, 4 * (self.S + 1), runner.stream)
        self._sent()

    # -- the API ----------------------------------------------------------------------------

    def open(self, prompt_ids, pick: Pick, max_new: int, stop_ids) -> int:
        if len(prompt_ids) + max_new > self.C:
            raise RequestError(f"prompt ({len(prompt_ids)}) + max_tokens ({max_new}) exceed the context of {self.C}")
        sp = RxSampling()
        ps = pick.params
        sp.temperature, sp.top_k, sp.top_p, sp.min_p = ps.temperature, ps.top_k, ps.top_p, ps.min_p
        sp.seed = (ps.seed or 0) & 0xFFFFFFFFFFFFFFFF

        def make(base, blocks):
            # the hooks may allocate: before the slot is taken (a failure gives the blocks back)
            hooks = self.r.pick_hooks(pick, self.r.model.p("tokens") + 4 * self.X)
            return _Seq(base, blocks, list(prompt_ids), pick, max_new, frozenset(stop_ids), sampling=sp, hooks=hooks)

        return self._take(len(prompt_ids) + max_new, make)

    def open_score(self, prompt_ids, candidates) -> int:
        """A system1 request as a sequence whose range holds its tree (gpu/score.py); step()'s
        `score` runs it in one step, then the scheduler closes it."""
        n = tree_tokens(prompt_ids, candidates)  # the most slots any scoring way takes
        if n > self.C:
            raise RequestError(f"prompt + candidates ({n} tokens) exceed the context of {self.C}", field="candidates")
        return self._take(n, lambda base, blocks: _Scoring(base, blocks, list(prompt_ids), [list(c) for c in candidates]))

    def _take(self, n_slots: int, make) -> int:
        """A free sequence, blocks for n_slots from the pool (NoRoom: the scheduler keeps the
        request waiting) mapped into its range, and make(base, blocks) as its entry."""
        if not self.free:
            raise RequestError(f"all {self.S} sequences are in use")
        blocks = self.pool.take(n_slots)
        try:
            sid = self.free[-1]
            seq = make((sid + 1) * self.R, blocks)
            self._map(seq.base, blocks)
        except BaseException:
            self.pool.give(blocks)
            raise
        self.free.pop()
        self.seqs[sid] = seq
        return sid

    def close(self, sid: int) -> None:
        try:
            if sid in self.rows:  # queued steps still write its range: finish them first
                self._drain(self.pending)
                self.rows = [s for s in self.rows if s != sid]
                self.dirty = True
        finally:  # a failed drain (the device's fault) still frees the sequence
            self.pending.pop(sid, None)
            seq = self.seqs.pop(sid, None)
            if seq is not None:
                self.pool.give(seq.blocks)
                self.free.append(sid)
        if seq is not None:
            self._map(seq.base, [self.spare] * len(seq.blocks))  # a stale range never reaches a reused block

    def pause(self) -> None:
        """Before the runner uses the device state and cache range 0 itself (system1): the queued
        steps land (their tokens wait for the next step) and the rows are rewritten after."""
        self._drain(self.pending)
        self.dirty = bool(self.rows)

    def step(self, prefill, decode, score=()) -> dict[int, list]:
        out, self.pending = self.pending, {}
        plain = [s for s in decode if isinstance(self.seqs.get(s), _Seq) and self.seqs[s].hooks is None
                 and not self.seqs[s].ended]
        if set(plain) != set(self.rows) or self.dirty:
            self._drain(out)
            self.dirty = False
            self.rows = [s for s in self.rows if s in plain] + [s for s in plain if s not in self.rows]
            self._write_rows()
        packed = []
        for sid, n in prefill:
            if self.packs and self.seqs[sid].hooks is None:
                packed.append((sid, n))
            else:
                self._prefill(sid, n, out)
        if packed:
            self._prefill_packed(packed, out)
        for sid in score:  # like a prompt: after the decode rows, in its own range
            q = self.seqs[sid]
            out[sid] = scoring.score(self.r, q.prompt, q.candidates, Place(self.X, q.base))
        for sid in decode:
            seq = self.seqs.get(sid)
            if isinstance(seq, _Seq) and seq.hooks is not None and not seq.ended and seq.out:
                self._hooked_step(sid, seq, out)
        if self.rows:
            self._launch_ahead()
            if self.inflight:
                self._land(out)
        return out

    # -- decode rows ----------------------------------------------------------------------------

    def _write_rows(self) -> None:
        """Rows 0..N-1 of the state arrays from the host's view of each sequence (after a drain)."""
        n = len(self.rows)
        if not n:
            return
        seqs = [self.seqs[s] for s in self.rows]
        pos = [len(q.prompt) + q.out - 1 for q in seqs]  # the position of the latest token
        ints = {"tokens": [q.last for q in seqs], "pos": pos, "slot": [q.base + p for q, p in zip(seqs, pos)],
                "seg_lo": [q.base for q in seqs], "steps": [q.out for q in seqs],
                "row_slot": [q.base // self.R for q in seqs]}  # its recurrent state's slot: its range's
        for q in seqs:
            q.queued = q.out
        r, m = self.r, self.r.model
        ptr, view = self._input()
        words = view.cast("i")
        at = 0
        for name, vals in ints.items():
            words[at:at + n] = int_array(vals)
            r.dev.htod(m.p(name), ptr + 4 * at, 4 * n, r.stream)
            at += n
        words[at] = m.n_ctx if n > 1 else ints["slot"][0] + 1  # n_kv: every range / the row's own
        words[at + 1] = seqs[0].out  # step: the single-sequence pick's draw index
        r.dev.htod(m.p("n_kv"), ptr + 4 * at, 4, r.stream)
        r.dev.htod(m.p("step"), ptr + 4 * (at + 1), 4, r.stream)
        sb = ptr + 4 * (at + 2)
        for i, q in enumerate(seqs):
            ctypes.memmove(sb + SP * i, ctypes.addressof(q.sampling), SP)
        r.dev.htod(m.p("sampling_rows"), sb, SP * n, r.stream)
        if n == 1:
            r.dev.htod(m.p("sampling"), sb, SP, r.stream)
        self._sent()

    def _graph(self):
        n, r, m = len(self.rows), self.r, self.r.model
        # the longest row's next step's keys: past REFLEX_ATTN_TC_FROM the graph may take other attention kernels
        keys = max(len(self.seqs[s].prompt) + self.seqs[s].queued for s in self.rows)
        if n == 1:
            return r.step_graph(self.seqs[self.rows[0]].pick.greedy, rows=True, context=keys)

        def many():
            m.forward(n, first=0, rows=True, logit_row=0, logit_rows=n)
            sample.pick_rows(r.launch, m.p("logits"), self.vocab, m.p("sampling_rows"), self._rows_state, n)

        return r.graph(f"rows{n}", many, context=keys)

    def _launch_ahead(self) -> None:
        seqs = [self.seqs[s] for s in self.rows]
        g = None
        while len(self.inflight) <= AHEAD and all(q.queued < q.max_new for q in seqs):
            g = g or self._graph()
            g.launch(self.r.stream)
            k = self.n_launched % len(self._rb)
            self.r.dev.dtoh(self._rb[k][0], self.r.model.p("tokens"), 4 * len(self.rows), self.r.stream)
            self.r.dev.record(self._rb_ev[k], self.r.stream)
            self.inflight.append((k, tuple(self.rows)))
            self.n_launched += 1
            for q in seqs:
                q.queued += 1

    def _land(self, out) -> None:
        k, rows = self.inflight.popleft()
        self.r.dev.wait_event(self._rb_ev[k])
        toks = self._rb[k][1].cast("i")
        for i, sid in enumerate(rows):
            seq = self.seqs.get(sid)
            if seq is not None:
                self._emit(sid, seq, toks[i], out)

    def _drain(self, out) -> None:
        while self.inflight:
            self._land(out)

    # -- prompts and hooked picks --------------------------------------------------------------

    def _prefill(self, sid: int, n: int, out) -> None:
        seq = self.seqs[sid]
        r, m = self.r, self.r.model
        while n > 0:
            c = min(n, m.max_batch)
            ids = seq.prompt[seq.fed:seq.fed + c]
            last = seq.fed + c >= len(seq.prompt)
            self._write_chunk(ids, seq.fed)
            m.forward(c, first=self.X, kv_base=seq.base, logit_rows=1 if last else 0)
            r.forward_passes += 1
            seq.fed += c
            n -= c
            if last:
                self._pick_first(sid, seq, out)
                return

    def _prefill_packed(self, chunks, out) -> None:
        """(sid, n) chunks, several sequences to a forward of up to max_batch tokens (a chunk split
        where a forward fills)."""
        room, batch = self.r.model.max_batch, []
        for sid, n in chunks:
            seq = self.seqs[sid]
            while n > 0:
                c = min(n, room)
                batch.append((sid, seq, c))
                n -= c
                room -= c
                if room == 0:
                    self._forward_packed(batch, out)
                    room, batch = self.r.model.max_batch, []
        if batch:
            self._forward_packed(batch, out)

    def _forward_packed(self, batch, out) -> None:
        r, m = self.r, self.r.model
        ids, pos, slot, lo, ends = [], [], [], [], []
        for sid, seq, c in batch:
            p = range(seq.fed, seq.fed + c)
            ids += seq.prompt[seq.fed:seq.fed + c]
            pos += p
            slot += [seq.base + i for i in p]
            lo += [seq.base] * c
            seq.fed += c
            if seq.fed >= len(seq.prompt):
                ends.append((len(ids) - 1, sid, seq))
        n = len(ids)
        ptr, view = self._input()
        w = view.cast("i")
        for k, (name, vals) in enumerate((("tokens", ids), ("pos", pos), ("slot", slot), ("seg_lo", lo))):
            w[k * n:(k + 1) * n] = int_array(vals)
            r.dev.htod(m.p(name) + 4 * self.X, ptr + 4 * k * n, 4 * n, r.stream)
        w[4 * n] = m.n_ctx  # n_kv: every range (each token sees its own through seg_lo)
        r.dev.htod(m.p("n_kv"), ptr + 16 * n, 4, r.stream)
        self._sent()
        m.forward(n, first=self.X, segments=True, logit_rows=0)
        r.forward_passes += 1
        if ends:
            m.logits_of_rows([row for row, _, _ in ends])
            self._pick_firsts([(sid, seq) for _, sid, seq in ends], out)

    def _pick_firsts(self, seqs, out) -> None:
        """The first tokens of these sequences (no hooks), from logits rows 0..k-1: one pick_rows
        over k rows at state index X, draw index 0, each with its own sampling; read back at once."""
        r, m, k = self.r, self.r.model, len(seqs)
        ptr, view = self._input()
        view.cast("i")[:k] = int_array([0] * k)
        r.dev.htod(m.p("steps") + 4 * self.S, ptr, 4 * k, r.stream)
        self._sent()
        self._pick_rows_at_x([seq for _, seq in seqs])
        fptr, fview = self._firsts
        r.dev.dtoh(fptr, m.p("tokens") + 4 * self.X, 4 * k, r.stream)
        r.dev.sync(r.stream)
        toks = fview.cast("i")
        for i, (sid, seq) in enumerate(seqs):
            seq.queued = 1
            self._emit(sid, seq, toks[i], out)

    def _write_chunk(self, ids, start: int, steps: int = 0) -> None:
        """A chunk's tokens at state index X, positions (= slots in its range) from start; the pick
        after it draws with `steps` (the sequence's token index)."""
        r, m, n = self.r, self.r.model, len(ids)
        ptr, view = self._input()
        w = view.cast("i")
        pos = list(range(start, start + n))
        for k, (name, vals) in enumerate((("tokens", ids), ("pos", pos), ("slot", pos))):
            w[k * n:(k + 1) * n] = int_array(vals)
            r.dev.htod(m.p(name) + 4 * self.X, ptr + 4 * k * n, 4 * n, r.stream)
        w[3 * n], w[3 * n + 1] = m.n_ctx, steps  # n_kv: any slot of the chunk's range is visible
        r.dev.htod(m.p("n_kv"), ptr + 12 * n, 4, r.stream)
        r.dev.htod(m.p("steps") + 4 * self.S, ptr + 12 * n + 4, 4, r.stream)
        self._sent()

    def _pick_at_x(self, seq: _Seq) -> int | Sampled | None:
        """Pick from the logits row the head just wrote (the hooks around it), read it back."""
        r, m = self.r, self.r.model
        h = seq.hooks
        if h is not None and not h.before(m.p("logits")):
            return None
        self._pick_rows_at_x([seq])
        if h is not None:
            h.after(m.p("logits"))
        tok = r.read_token(m.p("tokens") + 4 * self.X)
        return h.result(tok) if h is not None else tok

    def _pick_rows_at_x(self, seqs) -> None:
        """reflex_pick_rows over logits rows 0..k-1 into state index X.., row i with seqs[i]'s
        sampling (sampling_rows and steps from index S: the decode rows' stay untouched)."""
        r, m = self.r, self.r.model
        ptr, _ = self._input()
        for i, seq in enumerate(seqs):
            ctypes.memmove(ptr + SP * i, ctypes.addressof(seq.sampling), SP)
        r.dev.htod(m.p("sampling_rows") + SP * self.S, ptr, SP * len(seqs), r.stream)
        self._sent()
        x = 4 * self.X
        rows = RxRows(m.p("tokens") + x, m.p("pos") + x, m.p("slot") + x, m.p("steps") + 4 * self.S)
        sample.pick_rows(r.launch, m.p("logits"), self.vocab, m.p("sampling_rows") + SP * self.S, rows, len(seqs))

    def _pick_first(self, sid: int, seq: _Seq, out) -> None:
        tok = self._pick_at_x(seq)
        seq.queued = 1
        self._emit(sid, seq, tok, out)

    def _hooked_step(self, sid: int, seq: _Seq, out) -> None:
        """One token of a hooked sequence: its latest token as a one-token chunk, then the pick."""
        pos = len(seq.prompt) + seq.out - 1
        self._write_chunk([seq.last], pos, steps=seq.out)
        with self.r.launch.attn_context(pos + 1):  # its keys: the tile kernels below REFLEX_ATTN_TC_FROM
            self.r.model.forward(1, first=self.X, kv_base=seq.base)
        self.r.forward_passes += 1
        seq.queued += 1
        self._emit(sid, seq, self._pick_at_x(seq), out)

    def _emit(self, sid: int, seq: _Seq, tok, out) -> None:
        if seq.ended:
            return
        out.setdefault(sid, []).append(tok)
        seq.out += 1
        if tok is None:
            seq.ended = True
            return
        seq.last = tok.token_id if isinstance(tok, Sampled) else tok
        if seq.last in seq.stop_ids or seq.out >= seq.max_new:
            seq.ended = True

    # -- the block table --------------------------------------------------------------------------

    def _map(self, base: int, blocks: list[int]) -> None:
        """Point the range's first len(blocks) table entries (from slot `base`) at `blocks`."""
        m = self.r.model
        ptr, view = self._input()
        view.cast("i")[:len(blocks)] = int_array(blocks)
        self.r.dev.htod(m.kv_table(base), ptr, 4 * len(blocks), self.r.stream)
        self._sent()

    # -- pinned inputs ----------------------------------------------------------------------------

    def _input(self):
        """The next pinned input buffer, once the copies that last read it have run."""
        k = self._in_at % PINNED
        if self._in_ev[k] is not None:
            self.r.dev.wait_event(self._in_ev[k])
        return self._in[k]

    def _sent(self) -> None:
        k = self._in_at % PINNED
        if self._in_ev[k] is None:
            self._in_ev[k] = self.r.dev.event()
        self.r.dev.record(self._in_ev[k], self.r.stream)
        self._in_at += 1

