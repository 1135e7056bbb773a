"""The CPU runner: the numpy reference model behind the engine's Runner interface."""

from __future__ import annotations

import time
from typing import Iterator

import numpy as np

from ..errors import RequestTimeout
from ..sampling import Sampled, SamplingParams
from ..tree import tree_layout
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


class ReferenceRunner:
    name = "cpu"
    checks_deadline = True  # generate_ids takes `deadline` (engine.Runner)

    def __init__(self, model, max_context: int | None = None):
        self.model = model
        self.max_context = max_context or min(model.config.context_length, 8192)

    def info(self) -> dict:
        return {"device": "cpu (numpy reference)"}

    def generate_ids(self, prompt_ids, params: SamplingParams, max_new: int, stop_ids, logprobs: int | None = None,
                     constraint=None, deadline: float | None = None) -> Iterator[int]:
        """engine.Runner.generate_ids: logprobs from the same logits row the pick reads; a
        constraint's bitmask applied before the pick (reference/sampling.py); with a deadline the
        prompt runs PREFILL_CHUNK tokens at a time, the deadline checked before each pass."""
        cache = self.model.new_cache(len(prompt_ids) + max_new)
        logits = self._prefill(prompt_ids, cache, deadline)
        words = np.zeros((logits.shape[-1] + 31) // 32, dtype=np.uint32) if constraint is not None else None
        for step in range(max_new):
            allow = None
            if constraint is not None:
                if not constraint.fill_mask(words.ctypes.data, words.nbytes):
                    return
                allow = allowed_bits(words, logits.shape[-1])
            tok = sample(logits, params, step, allow)
            if constraint is not None:
                constraint.accept(tok)
            if logprobs is None:
                yield tok
            else:
                yield Sampled(tok, *token_logprobs(logits, tok, logprobs))
            if tok in stop_ids or step + 1 == max_new:
                return
            logits = self.model.forward([tok], cache)[-1]

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
