"""Compare a backend's generated tokens (and logprobs) with the numpy reference, teacher-forced.

Two backends that differ only in float rounding agree on every token except where the reference
itself had a near-tie: two logits closer than the rounding (greedy), or a sampling draw that
lands within the rounding of a boundary between two tokens' shares. A free-running comparison
then diverges and every later token differs for no fault of either side. So, as `reflex check`
does for routing near-ties, the reference is fed the backend's own tokens (one forward over the
prompt and them), and each step is judged on its own: the backend's pick must be the
reference's, or a near-tie the reference's numbers show; logprobs within TOL; top-k ids equal
except among near-tied entries. Excused steps are counted and bounded by the caller, so a test
cannot pass by excusing everything.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from reflex_runtime.reference.sampling import allowed_bits, filter_mask, sample, token_logprobs
from reflex_runtime.sampling import SamplingParams, uniform

TOL = 2e-3  # logprob difference the forward passes' float rounding may make
DRAW_TOL = 5e-3  # share of the kept mass within which a draw counts as on a boundary


@dataclass
class Verdict:
    steps: int = 0
    pick_ties: list[int] = field(default_factory=list)  # steps whose pick differed at a near-tie
    top_ties: list[int] = field(default_factory=list)  # steps whose top ids differed among near-ties

    @property
    def excused(self) -> int:
        return len(set(self.pick_ties) | set(self.top_ties))


def reference_rows(model, prompt_ids, tokens) -> np.ndarray:
    """Logits before each of `tokens` (row j predicts tokens[j]), from one reference forward."""
    cache = model.new_cache(len(prompt_ids) + len(tokens))
    return model.forward(list(prompt_ids) + list(tokens[:-1]), cache)[len(prompt_ids) - 1:]


def _draw_margin(row, params: SamplingParams, step: int, token: int, allow) -> float:
    """How far (as a share of the kept mass) the step's draw lies from `token`'s interval in the
    reference's running sum: 0 when the reference would pick it too."""
    keep, p = filter_mask(row, params, allow)
    kept = np.flatnonzero(keep)
    at = np.searchsorted(kept, token)
    if at >= kept.size or kept[at] != token:
        return float("inf")  # the reference would never pick it
    running = np.cumsum(p[kept], dtype=np.float64)
    lo, hi = (running[at - 1] if at else 0.0), running[at]
    u = uniform(0 if params.seed is None else params.seed, step) * running[-1]
    return max(lo - u, u - hi, 0.0) / running[-1]


def compare(model, prompt_ids, got, params: SamplingParams, constraint=None, logprobs: int | None = None) -> Verdict:
    """Judge `got` (ints, or Sampled when logprobs was asked) step by step against the reference.
    constraint: a fresh grammar.Constraint of the same grammar, replayed on the backend's tokens."""
    tokens = [int(getattr(g, "token_id", g)) for g in got]
    rows = reference_rows(model, prompt_ids, tokens)
    vocab = rows.shape[-1]
    words = np.zeros((vocab + 31) // 32, dtype=np.uint32)
    v = Verdict(steps=len(tokens))
    for j, (tok, row) in enumerate(zip(tokens, rows)):
        allow = None
        if constraint is not None:
            assert constraint.fill_mask(words.ctypes.data, words.nbytes), f"step {j}: the grammar allows nothing"
            allow = allowed_bits(words, vocab)
            assert allow[tok], f"step {j}: token {tok} is outside the grammar"
        want = sample(row, params, j, allow)
        if tok != want:
            lp = token_logprobs(row, tok, 0)[0], token_logprobs(row, want, 0)[0]
            margin = abs(lp[0] - lp[1]) if params.greedy else _draw_margin(row, params, j, tok, allow)
            assert margin < (2 * TOL if params.greedy else DRAW_TOL), (
                f"step {j}: picked {tok}, the reference picks {want} (margin {margin:.3g}: not a near-tie)")
            v.pick_ties.append(j)
        if constraint is not None:
            constraint.accept(tok)
        if logprobs is None:
            continue
        g = got[j]
        want_lp, want_ids, want_lps = token_logprobs(row, tok, logprobs)
        assert abs(g.logprob - want_lp) < TOL, (j, g.logprob, want_lp)
        np.testing.assert_allclose(g.top_logprobs, want_lps, atol=TOL, err_msg=f"step {j}")
        for i, (a, b) in enumerate(zip(g.top_ids, want_ids)):
            if a != b:  # allowed only when the reference gives a the same logprob as the entry it displaced
                ref_a = token_logprobs(row, a, 0)[0]
                assert abs(ref_a - want_lps[i]) < TOL, f"step {j}: top id {i} is {a}, the reference's {b}"
                if v.top_ties[-1:] != [j]:
                    v.top_ties.append(j)
    return v
