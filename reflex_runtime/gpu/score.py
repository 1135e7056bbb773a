"""system1 scoring on the CUDA runner: the prompt and the candidates through the model, then each
candidate token's log-probability read back (engine.system1). Three ways, by the model and size:
- tree: the prompt and every candidate in one pass, each candidate attending to the prompt and to
  itself (tree_layout's mask; attention-only models);
- long: prompt + candidates beyond one pass: the prompt with each candidate in turn, in chunks;
- fork: recurrent models (GpuModel.scoring == "fork"): the prompt once, its state copied once per
  candidate, the candidates as one pass of independent sequences.

Each way runs at a Place: the state index of its first token and the cache slot its range starts
at. The runner's own place is (0, 0). In a batch (gpu/batch.py) a system1 request is a sequence:
its place is the state after the decode rows and its own paged range, so it joins a step as a
prompt chunk does, with the queued decode steps left running and their rows untouched (n_kv stays
at least every row's slot + 1, the draw counter `step` is not written).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import RequestError
from ..tree import tree_layout
from .ops.logits import logprob_rows
from .step import int_array

MAX_SCORED = 8192  # candidate tokens per system1 call (the engine's limits are lower)


@dataclass(frozen=True)
class Place:
    at: int = 0  # state index of the first token
    kv_base: int = 0  # the cache slot its range starts at (0: the runner's own range)

    @property
    def in_batch(self) -> bool:
        return self.at > 0


def score(r, prompt_ids, candidates, place: Place = Place()) -> list[list[float]]:
    """Per candidate, its tokens' log-probabilities after the prompt (r: the CudaRunner)."""
    if r.model.scoring == "fork":
        return _forked(r, prompt_ids, candidates, place)
    ids, positions, seg_lo, predictors = tree_layout(prompt_ids, candidates)
    n_p, n = len(prompt_ids), len(ids)
    if n > r.model.max_batch:
        return _long(r, prompt_ids, candidates, place)
    _write(r, place, ids, positions, list(range(n)), seg_lo=seg_lo)
    rows = n - n_p + 1  # logits for the last prompt row and every candidate row
    logits = r.logits_buffer(rows)
    _forward(r, place, n, tree=True, prefix_len=n_p, logit_row=n_p - 1, logit_rows=rows, logits=logits)
    flat_rows = [row - (n_p - 1) for rs in predictors for row in rs]
    flat_toks = [t for c in candidates for t in c]
    return gather(r, logits, flat_rows, flat_toks, [len(c) for c in candidates])


def _long(r, prompt_ids, candidates, place: Place) -> list[list[float]]:
    """Prompt + candidates larger than one pass: the prompt with each candidate in turn (its
    tokens in the cache slots after the prompt, overwriting the previous candidate's)."""
    n_p, out = len(prompt_ids), []
    for cand in candidates:
        logits = r.logits_buffer(len(cand))
        # rows n_p - 1 .. n_p + len(cand) - 2 predict the candidate's tokens: they may span chunks
        _chunks(r, place, list(prompt_ids) + list(cand), logits, n_p - 1, len(cand))
        out += gather(r, logits, list(range(len(cand))), list(cand), [len(cand)])
    return out


def _chunks(r, place: Place, ids, logits: int = 0, lo: int = 0, n_rows: int = 0) -> None:
    """ids from position (= slot) 0 in passes of at most max_batch; the logits of rows lo ..
    lo + n_rows - 1 into `logits` (row lo first), whichever passes they fall in."""
    step, vocab = r.model.max_batch, r.config.vocab_size
    for c0 in range(0, len(ids), step):
        m = min(step, len(ids) - c0)
        pos = list(range(c0, c0 + m))
        _write(r, place, ids[c0:c0 + m], pos, pos)
        a, b = max(lo, c0), min(lo + n_rows, c0 + m)
        if b > a:
            _forward(r, place, m, logit_row=a - c0, logit_rows=b - a, logits=logits + 4 * (a - lo) * vocab)
        else:
            _forward(r, place, m, logit_rows=0)


def _forked(r, prompt_ids, candidates, place: Place) -> list[list[float]]:
    """The prompt once (its last row's logits score every candidate's first token), then the state
    after it copied once per candidate and all candidates' tokens but their last in one pass of
    independent sequences (tree mask for attention: each sees the prompt and itself). More than
    one pass only when the candidates exceed a pass (max_batch tokens, model.max_forks() copies)."""
    n_p, d = len(prompt_ids), r.model
    tails = [list(c[:-1]) for c in candidates]  # the tokens whose logits score the next one
    logits = r.logits_buffer(1 + sum(len(t) for t in tails))
    _chunks(r, place, list(prompt_ids), logits, n_p - 1, 1)
    groups: list[list[int]] = [[]]  # candidates per pass: normally all of them in one
    size, limit = 0, d.max_forks()
    for ci in (i for i, t in enumerate(tails) if t):
        if groups[-1] and (size + len(tails[ci]) > d.max_batch or len(groups[-1]) >= limit):
            groups.append([])
            size = 0
        groups[-1].append(ci)
        size += len(tails[ci])
    row, first_row = 1, {}  # logits row of each candidate's first tail token
    for group in filter(None, groups):
        start = row
        for ci in group:
            first_row[ci] = row
            row += len(tails[ci])
        _forked_pass(r, place, n_p, [tails[ci] for ci in group], logits + 4 * start * r.config.vocab_size)
    flat_rows, flat_toks = [], []
    for ci, cand in enumerate(candidates):
        flat_rows += [0] + [first_row[ci] + j for j in range(len(cand) - 1)]
        flat_toks += list(cand)
    return gather(r, logits, flat_rows, flat_toks, [len(c) for c in candidates])


def _forked_pass(r, place: Place, n_p: int, seqs: list[list[int]], logits: int) -> None:
    """One pass over `seqs`, each continuing its own copy of the prompt's state, in the cache
    slots after the prompt; every row's logits into `logits`."""
    toks, pos, slots, seg_lo, starts = [], [], [], [], [0]
    for seq in seqs:
        start = n_p + len(toks)
        for j, tok in enumerate(seq):
            slots.append(n_p + len(toks))
            toks.append(tok)
            pos.append(n_p + j)
            seg_lo.append(start)
        starts.append(len(toks))
    n = len(toks)
    _write(r, place, toks, pos, slots, seg_lo=seg_lo, seq_start=starts)
    r.model.fork(len(seqs), place.kv_base)
    _forward(r, place, n, tree=True, prefix_len=n_p, logit_row=0, logit_rows=n, logits=logits, seqs=len(seqs),
             seq_max=max(len(x) for x in seqs))


def _write(r, place: Place, tokens, pos, slots, seg_lo=None, seq_start=None) -> None:
    # in a batch, n_kv = the whole context (the decode rows read min(n_kv, own slot + 1); a
    # range's keys are bounded by each query's slot anyway) and the rows' draw counter is kept
    n_kv = r.model.n_ctx if place.in_batch else max(slots) + 1
    r.write_inputs(tokens, pos, slots, seg_lo=seg_lo, n_kv=n_kv, seq_start=seq_start, first=place.at,
                    step=None if place.in_batch else 0)


def _forward(r, place: Place, n: int, **kw) -> None:
    r.model.forward(n, first=place.at, kv_base=place.kv_base, **kw)
    r.forward_passes += 1


def gather(r, logits, rows, toks, lengths) -> list[list[float]]:
    """log_softmax(logits[rows[i]])[toks[i]] for each i, split into `lengths`."""
    dev, s = r.dev, r.stream
    m = len(rows)
    if m > MAX_SCORED:
        raise RequestError(f"{m} candidate tokens exceed {MAX_SCORED}", field="candidates")
    ptr, view = r.pinned_scoring()
    ints = view.cast("i")
    ints[:m] = int_array(rows)
    ints[m:2 * m] = int_array(toks)
    tmp = r.scratch(3 * m)
    dev.htod(tmp, ptr, 8 * m, s)
    logprob_rows(r.launch, logits, r.config.vocab_size, tmp, tmp + 4 * m, tmp + 8 * m, m)
    dev.dtoh(ptr, tmp + 8 * m, 4 * m, s)
    dev.sync(s)
    vals = list(view.cast("f")[:m])
    out, k = [], 0
    for ln in lengths:
        out.append(vals[k:k + ln])
        k += ln
    return out
