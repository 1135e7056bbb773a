"""Generation with `logprobs` or a grammar on the GPU (CudaRunner.generate_ids hands these
requests here; plain ones keep the graph-replayed loop that reads one int per token).

Each step: the decode forward (one CUDA graph, without the pick), then on the same stream
- logprobs: reflex_logit_stats over the raw logits (64 slices: max, sum of exp, the k largest),
  ~5 KB back instead of the vocabulary's 600 KB; merge_stats() turns the slices into logsumexp
  and the top k, and reflex_token_logit reads the chosen token's logit after the pick;
- a grammar: the constraint fills the next bitmask on the host while the GPU runs the forward
  (llguidance needs the previous token, as the forward does), it is copied up, and
  reflex_mask_logits sets every forbidden logit to -inf before the usual pick (argmax or sampler).
The host waits for each token before it queues the next step: the mask depends on it.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from ..sampling import MAX_TOP_LOGPROBS, Sampled, SamplingParams

STATS_TOPK = MAX_TOP_LOGPROBS  # kernels/constrain.cu RX_TOPK_MAX
STATS_PARTS = 64  # slices of the row: enough blocks to read 150k-256k logits at full bandwidth


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


def generate_checked(runner, prompt_ids, params: SamplingParams, max_new: int, stop_ids, logprobs: int | None,
                     constraint) -> Iterator[int | Sampled]:
    """engine.Runner.generate_ids with logprobs and/or a constraint, on a loaded CudaRunner."""
    r, dev, s, model = runner, runner.dev, runner.stream, runner.model
    vocab = r.config.vocab_size
    if r._constrain_bufs is None:
        r._constrain_bufs = StepBuffers(dev, vocab)
    b = r._constrain_bufs
    greedy = params.temperature <= 0 or params.top_k == 1
    n = len(prompt_ids)
    positions = range(n)
    r._write_inputs(prompt_ids, positions, positions, n_kv=n, sampling=None if greedy else params)
    logits = model.p("logits")
    try:
        r._prefill(n)
        last, graph = n - 1, None
        for i in range(max_new):
            # This position's logits are queued on the stream (the prefill, or the step's forward).
            if logprobs is not None:
                r.launch.logit_stats(logits, vocab, logprobs, b.dev(b.part_f_at), b.dev(b.part_i_at), STATS_PARTS)
                dev.dtoh(b.host(b.part_f_at), b.dev(b.part_f_at), b.part_f.nbytes + b.part_i.nbytes, s)
            if constraint is not None:
                if not constraint.fill_mask(b.host(b.mask_at), b.mask.nbytes):  # on the CPU, beside the forward
                    return
                dev.htod(b.dev(b.mask_at), b.host(b.mask_at), b.mask.nbytes, s)
                r.launch.mask_logits(logits, b.dev(b.mask_at), vocab)
            r._pick(greedy, last)
            if logprobs is not None:
                r.launch.token_logit(logits, model.p("tokens"), b.dev(b.logit_at))
                dev.dtoh(b.host(b.logit_at), b.dev(b.logit_at), 4, s)
            r._readback(i)
            tok = r._token(i)  # waits for the copies above too (one stream)
            if constraint is not None:
                constraint.accept(tok)
            if logprobs is None:
                yield tok
            else:
                lse, ids, vals = merge_stats(b.part_f, b.part_i, logprobs)
                yield Sampled(tok, float(b.logit[0]) - lse, ids, [v - lse for v in vals])
            if tok in stop_ids or i + 1 >= max_new:
                return
            if graph is None:
                graph = r._forward_graph()
            graph.launch(s)
            last = 0
    finally:
        dev.sync(s)  # nothing in flight touches the inputs of the next request
