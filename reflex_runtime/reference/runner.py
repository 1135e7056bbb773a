"""The CPU runner: the numpy reference model behind the engine's Runner interface."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..errors import RequestError, RequestTimeout
from ..kvpool import BlockPool, blocks_for
from ..sampling import Pick, Sampled, SamplingParams
from ..tree import tree_layout, tree_tokens
from .sampling import allowed_bits, sample, token_logprobs


def log_softmax_rows(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def tree_batch(prompt_ids: list[int], candidates: list[list[int]]):
    """The system1 batch (tree.tree_layout) with its attention rule as a bool mask."""
    ids, positions, seg_lo, predictors = tree_layout(prompt_ids, candidates)
    n_p, n = len(prompt_ids), len(ids)
    slots = np.arange(n)
    mask = (slots[None, :] <= slots[:, None]) & ((slots[None, :] < n_p) | (slots[None, :] >= np.asarray(seg_lo)[:, None]))
    return ids, np.asarray(positions, dtype=np.int64), mask, predictors


# Prompt tokens per forward pass when a deadline is checked between passes (~0.4 s each for
# SmolLM2-135M on the 2-core development VM): the request timeout then overshoots by one pass at most.
PREFILL_CHUNK = 256


def mask_words(logits: np.ndarray, pick: Pick):
    """The buffer a constraint writes its bitmask into (None without one)."""
    return np.zeros((logits.shape[-1] + 31) // 32, dtype=np.uint32) if pick.constraint is not None else None


def pick_token(logits: np.ndarray, pick: Pick, step: int, words) -> int | Sampled | None:
    """Generated token number `step` from one row of logits: the constraint's mask first (None
    when it allows nothing), then the draw, then logprobs from the same row (Pick's rules)."""
    allow, c = None, pick.constraint
    if c is not None:
        if not c.fill_mask(words.ctypes.data, words.nbytes):
            return None
        allow = allowed_bits(words, logits.shape[-1])
    tok = sample(logits, pick.params, step, allow)
    if c is not None:
        c.accept(tok)
    return tok if pick.logprobs is None else Sampled(tok, *token_logprobs(logits, tok, pick.logprobs))


@dataclass
class _Seq:
    """One sequence of the batch API: its prompt, cache and progress."""

    prompt: list[int]
    pick: Pick
    cache: object
    fed: int = 0  # prompt tokens forwarded
    n_out: int = 0  # tokens picked
    last: int = -1  # the last picked id (the next decode's input)
    words: object = None


class ReferenceRunner:
    name = "cpu"
    checks_deadline = True  # generate_ids takes `deadline` (engine.Runner)
    prefill_chunk = PREFILL_CHUNK  # the scheduler's prompt tokens per step stay within one pass

    def __init__(self, model, max_context: int | None = None, max_seqs: int = 8, kv_tokens: int | None = None):
        self.model = model
        self.max_context = max_context or min(model.config.context_length, 8192)
        self.max_seqs = max_seqs  # the batch API (scheduler.py): sequences held at once
        # the CUDA runner's paged-cache accounting (kvpool.py), so that waiting for room is the same here
        ctx_blocks = blocks_for(self.max_context)
        full = max_seqs * ctx_blocks
        self.pool = BlockPool(0, max(min(blocks_for(kv_tokens) if kv_tokens else full, full), ctx_blocks))
        self._blocks: dict[int, list[int]] = {}
        self._seqs: dict[int, _Seq] = {}
        self._scoring: dict[int, tuple] = {}  # system1 requests' (prompt, candidates)
        self._sids = itertools.count()

    def info(self) -> dict:
        return {"device": "cpu (numpy reference)"}

    def generate_ids(self, prompt_ids, params: SamplingParams, max_new: int, stop_ids, logprobs: int | None = None,
                     constraint=None, deadline: float | None = None) -> Iterator[int]:
        """engine.Runner.generate_ids: logprobs from the same logits row the pick reads; a
        constraint's bitmask applied before the pick (reference/sampling.py); with a deadline the
        prompt runs PREFILL_CHUNK tokens at a time, the deadline checked before each pass."""
        cache = self.model.new_cache(len(prompt_ids) + max_new)
        logits = self._prefill(prompt_ids, cache, deadline)
        pick = Pick(params, logprobs, constraint)
        words = mask_words(logits, pick)
        for step in range(max_new):
            tok = pick_token(logits, pick, step, words)
            if tok is None:
                return
            yield tok
            tok = tok.token_id if isinstance(tok, Sampled) else tok
            if tok in stop_ids or step + 1 == max_new:
                return
            logits = self.model.forward([tok], cache)[-1]

    # -- the batch API (scheduler.py; docs/INTERNALS.md "Scheduler"): numpy loops over sequences --

    def batch_open(self, prompt_ids, pick: Pick, max_new: int, stop_ids) -> int:
        if len(prompt_ids) + max_new > self.max_context:
            raise RequestError(f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_new}) exceeds the context of "
                               f"{self.max_context}", field="max_tokens")
        blocks = self.pool.take(len(prompt_ids) + max_new)  # NoRoom: the scheduler keeps it waiting
        sid = next(self._sids)
        self._blocks[sid] = blocks
        self._seqs[sid] = _Seq(list(prompt_ids), pick, self.model.new_cache(len(prompt_ids) + max_new))
        return sid

    def batch_open_score(self, prompt_ids, candidates) -> int:
        """A system1 request as a sequence of one step: blocks for its tree, as on the GPU."""
        n = tree_tokens(prompt_ids, candidates)
        if n > self.max_context:
            raise RequestError(f"prompt + candidates ({n} tokens) exceed the context of {self.max_context}",
                               field="candidates")
        blocks = self.pool.take(n)
        sid = next(self._sids)
        self._blocks[sid] = blocks
        self._scoring[sid] = (list(prompt_ids), [list(c) for c in candidates])
        return sid

    def batch_step(self, prefill, decode, score=()) -> dict[int, list]:
        out = {sid: self.score(*self._scoring[sid]) for sid in score}
        for sid, n in prefill:
            s = self._seqs[sid]
            logits = self.model.forward(s.prompt[s.fed:s.fed + n], s.cache)[-1]
            s.fed += n
            if s.fed == len(s.prompt):
                out[sid] = [self._pick(s, logits)]
        for sid in decode:
            s = self._seqs[sid]
            out[sid] = [self._pick(s, self.model.forward([s.last], s.cache)[-1])]
        return out

    def batch_close(self, sid: int) -> None:
        self._seqs.pop(sid, None)
        self._scoring.pop(sid, None)
        self.pool.give(self._blocks.pop(sid, []))

    def _pick(self, s: _Seq, logits):
        if s.words is None:
            s.words = mask_words(logits, s.pick)
        tok = pick_token(logits, s.pick, s.n_out, s.words)
        s.n_out += 1
        s.last = tok.token_id if isinstance(tok, Sampled) else (tok if tok is not None else -1)
        return tok

    def _prefill(self, ids, cache, deadline: float | None) -> np.ndarray:
        if deadline is None:
            return self.model.forward(ids, cache)[-1]
        for c0 in range(0, len(ids), PREFILL_CHUNK):
            if time.perf_counter() > deadline:
                raise RequestTimeout(f"deadline passed after {c0} of {len(ids)} prompt tokens")
            logits = self.model.forward(ids[c0:c0 + PREFILL_CHUNK], cache)[-1]
        return logits

    def score(self, prompt_ids, candidates) -> list[list[float]]:
        if getattr(self.model, "supports_tree_mask", True):
            ids, positions, mask, predictors = tree_batch(prompt_ids, candidates)
            cache = self.model.new_cache(len(ids))
            logp = log_softmax_rows(self.model.forward(ids, cache, positions=positions, mask=mask))
            out = []
            for cand, rows in zip(candidates, predictors):
                out.append([float(logp[r, tok]) for r, tok in zip(rows, cand)])
            return out
        # Recurrent state cannot be masked: run the prompt once, then each candidate from a copy.
        total = len(prompt_ids) + max(len(c) for c in candidates)
        cache = self.model.new_cache(total)
        last = log_softmax_rows(self.model.forward(prompt_ids, cache)[-1:])[0]
        out = []
        for cand in candidates:
            branch = cache.copy()
            lp = [float(last[cand[0]])]
            if len(cand) > 1:
                rows = log_softmax_rows(self.model.forward(cand[:-1], branch))
                lp += [float(rows[j, cand[j + 1]]) for j in range(len(cand) - 1)]
            out.append(lp)
        return out
