"""The pick hooks for `logprobs` and grammars on the GPU (CudaRunner.pick runs them around the
pick of a sequence whose Pick asks for them; CudaRunner.decode is the loop). Per token, on the
runner's stream:
- logprobs: reflex_logit_stats over the raw logits (64 slices: max, sum of exp, the k largest),
  ~5 KB back instead of the vocabulary's 600 KB; merge_stats() turns the slices into logsumexp
  and the top k, and reflex_token_logit reads the chosen token's logit after the pick;
- a grammar: the constraint fills the next bitmask on the host while the GPU runs the forward
  (llguidance needs the previous token, as the forward does), it is copied up, and
  reflex_mask_logits sets every forbidden logit to -inf before the usual pick (argmax or sampler).
The host waits for each token before it queues the next step: the mask depends on it.
"""

from __future__ import annotations

import numpy as np

from ..sampling import Sampled
from .ops import constrain
from .ops.constrain import STATS_PARTS, STATS_TOPK


def merge_stats(part_f: np.ndarray, part_i: np.ndarray, k: int) -> tuple[float, list[int], list[float]]:
    """Slices -> (logsumexp of the row, the k largest ids, their logits): larger first, the lower
    id on ties, as reference/sampling.py token_logprobs orders them. part_f: (P, 2 + STATS_TOPK),
    part_i: (P, STATS_TOPK), both as reflex_logit_stats writes them."""
    m = part_f[:, 0].astype(np.float64)
    s = part_f[:, 1].astype(np.float64)
    top = m.max()
    lse = float(top + np.log(np.sum(s * np.exp(m - top))))
    if k == 0:
        return lse, [], []
    vals = part_f[:, 2:2 + k].reshape(-1)
    ids = part_i[:, :k].reshape(-1)
    keep = ids >= 0
    vals, ids = vals[keep], ids[keep]
    order = np.lexsort((ids, -vals.astype(np.float64)))[:k]
    return lse, [int(i) for i in ids[order]], [float(v) for v in vals[order]]


class StepBuffers:
    """Device scratch and pinned host mirrors for one runner (allocated on the first such request)."""

    def __init__(self, dev, vocab_size: int):
        self.words = (vocab_size + 31) // 32
        n_f, n_i = STATS_PARTS * (2 + STATS_TOPK), STATS_PARTS * STATS_TOPK
        self.nbytes = 4 * (self.words + n_f + n_i + 1)
        self.dev_ptr = dev.alloc(self.nbytes)
        self.host_ptr, view = dev.alloc_pinned(self.nbytes)
        raw = np.frombuffer(view, dtype=np.uint8)
        at = 0

        def take(count: int, dtype) -> tuple[int, np.ndarray]:
            nonlocal at
            off, at = at, at + 4 * count
            return off, raw[off:at].view(dtype)

        self.mask_at, self.mask = take(self.words, np.uint32)
        self.part_f_at, self.part_f = take(n_f, np.float32)
        self.part_i_at, self.part_i = take(n_i, np.int32)
        self.logit_at, self.logit = take(1, np.float32)
        self.part_f = self.part_f.reshape(STATS_PARTS, 2 + STATS_TOPK)
        self.part_i = self.part_i.reshape(STATS_PARTS, STATS_TOPK)

    def dev(self, at: int) -> int:
        return self.dev_ptr + at

    def host(self, at: int) -> int:
        return self.host_ptr + at


class PickHooks:
    """Around one sequence's pick: before it the statistics of the raw logits (logprobs) and the
    grammar's mask, after it the chosen token's logit; result() turns the read-back token into
    what the decode loop yields (the constraint accepts it first)."""

    def __init__(self, launch, dev, stream, tokens_ptr: int, vocab: int, bufs: StepBuffers, pick):
        self.launch, self.dev, self.stream, self.tokens, self.vocab, self.b = launch, dev, stream, tokens_ptr, vocab, bufs
        self.logprobs, self.constraint = pick.logprobs, pick.constraint

    def before(self, logits: int) -> bool:
        """Queue the statistics and the mask of this position's logits (queued on the stream by
        the prefill or the step's forward). False: the grammar allows no token."""
        b, s = self.b, self.stream
        if self.logprobs is not None:
            constrain.logit_stats(self.launch, logits, self.vocab, self.logprobs, b.dev(b.part_f_at), b.dev(b.part_i_at),
                                  STATS_PARTS)
            self.dev.dtoh(b.host(b.part_f_at), b.dev(b.part_f_at), b.part_f.nbytes + b.part_i.nbytes, s)
        if self.constraint is not None:
            if not self.constraint.fill_mask(b.host(b.mask_at), b.mask.nbytes):  # on the CPU, beside the forward
                return False
            self.dev.htod(b.dev(b.mask_at), b.host(b.mask_at), b.mask.nbytes, s)
            constrain.mask_logits(self.launch, logits, b.dev(b.mask_at), self.vocab)
        return True

    def after(self, logits: int) -> None:
        b = self.b
        if self.logprobs is not None:
            constrain.token_logit(self.launch, logits, self.tokens, b.dev(b.logit_at))
            self.dev.dtoh(b.host(b.logit_at), b.dev(b.logit_at), 4, self.stream)

    def result(self, tok: int) -> int | Sampled:
        """After the token's read-back (the copies above came before it on the stream)."""
        if self.constraint is not None:
            self.constraint.accept(tok)
        if self.logprobs is None:
            return tok
        lse, ids, vals = merge_stats(self.b.part_f, self.b.part_i, self.logprobs)
        return Sampled(tok, float(self.b.logit[0]) - lse, ids, [v - lse for v in vals])
