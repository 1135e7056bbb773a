"""The reference sampler: docs/INTERNALS.md "Sampling", rule by rule, in numpy.

Numerics: z and p are float32 (as on the GPU); every sum of p (top-p mass, kept mass, the
running sum of the draw) is accumulated in float64 in the order the rules give.
"""

from __future__ import annotations

import numpy as np

from ..sampling import SamplingParams, uniform


def allowed_bits(words, vocab: int) -> np.ndarray:
    """A grammar's bitmask (uint32 words, bit i of word i // 32: grammar.py) as a bool array."""
    bits = np.unpackbits(np.asarray(words, dtype="<u4").view(np.uint8), bitorder="little")
    return bits[:vocab].astype(bool)


def masked(logits_row: np.ndarray, allow: np.ndarray | None) -> np.ndarray:
    """Rule 0 (constrained requests): tokens the grammar forbids get -inf before any other rule."""
    row = np.asarray(logits_row, dtype=np.float32)
    return row if allow is None else np.where(allow, row, np.float32(-np.inf))


def filter_mask(logits_row: np.ndarray, params: SamplingParams, allow: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """Rules 2-5 for a non-greedy draw: (kept bool mask, unnormalized p float32)."""
    z = masked(logits_row, allow) / np.float32(params.temperature)
    zmax = z.max()
    p = np.exp(z - zmax)
    keep = np.ones(z.shape, dtype=bool)
    k = int(params.top_k)
    if 0 < k < z.size:
        t_k = np.partition(z, z.size - k)[z.size - k]  # the k-th largest z
        keep &= z >= t_k
    if params.top_p < 1.0:
        idx = np.flatnonzero(keep)
        order = idx[np.argsort(-z[idx], kind="stable")]
        csum = np.cumsum(p[order], dtype=np.float64)
        target = float(params.top_p) * csum[-1]
        # first position where the mass at or above it reaches the target; its z is t_p, and
        # comparing z >= t_p keeps every token tied with it.
        first = int(np.searchsorted(csum, target, side="left"))
        first = min(first, order.size - 1)
        keep &= z >= z[order[first]]
    if params.min_p > 0.0:
        keep &= p >= np.float32(params.min_p)
    if allow is not None:
        keep &= allow
    return keep, p


def sample(logits_row: np.ndarray, params: SamplingParams, step: int, allow: np.ndarray | None = None) -> int:
    """One token id from one row of logits, for generated token number `step` (from 0).
    seed None counts as 0 here (the engine replaces None by a random seed before sampling).
    allow: a grammar's bool mask (at least one True), applied before every rule."""
    logits_row = np.asarray(logits_row)
    if params.temperature <= 0.0 or params.top_k == 1:
        return int(np.argmax(masked(logits_row, allow)))  # argmax returns the first (lowest) id among ties
    keep, p = filter_mask(logits_row, params, allow)
    kept = np.flatnonzero(keep)
    running = np.cumsum(p[kept], dtype=np.float64)
    u = uniform(0 if params.seed is None else params.seed, step)
    threshold = u * running[-1]
    i = int(np.searchsorted(running, threshold, side="right"))  # first running sum > threshold
    return int(kept[min(i, kept.size - 1)])


def kept_probabilities(logits_row: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The distribution the draw follows (float64, sums to 1): for tests and `check`."""
    if params.temperature <= 0.0 or params.top_k == 1:
        out = np.zeros(np.asarray(logits_row).shape, dtype=np.float64)
        out[int(np.argmax(logits_row))] = 1.0
        return out
    keep, p = filter_mask(logits_row, params)
    out = np.where(keep, p.astype(np.float64), 0.0)
    return out / out.sum()


def token_logprobs(logits_row: np.ndarray, token: int, k: int) -> tuple[float, list[int], list[float]]:
    """What `logprobs` reports for one generated token: the log-softmax of the model's logits
    (no temperature, no filters, no grammar mask: as OpenAI reports them), in float64, for the
    chosen token and the k most likely ones (larger first, lower id on ties)."""
    x = np.asarray(logits_row, dtype=np.float64)
    m = x.max()
    lp = x - m - np.log(np.exp(x - m).sum())
    top = np.zeros(0, dtype=np.int64)
    if k > 0:
        k = min(k, x.size)
        cand = np.flatnonzero(x >= np.partition(x, x.size - k)[x.size - k])  # the k largest and their ties
        top = cand[np.lexsort((cand, -x[cand]))][:k]
    return float(lp[token]), [int(i) for i in top], [float(lp[i]) for i in top]


__all__ = ["sample", "filter_mask", "kept_probabilities", "allowed_bits", "masked", "token_logprobs"]
