"""Sampling parameters and the counter-based random draw every backend shares.

No numpy here: this is imported on the cold path, and the GPU sampler mirrors it bit for bit.
The rules (docs/INTERNALS.md, "Sampling"): greedy when temperature <= 0 or top_k == 1 (ties to
the lowest id); otherwise z = logits / temperature, p = exp(z - max z), then top-k, top-p and
min-p filters in that order, then one draw `u = uniform(seed, step)` walked over the kept tokens
in token-id order. The numpy implementation is reflex_runtime/reference/sampling.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MASK64 = (1 << 64) - 1
MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs; the GPU kernel keeps this many


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off
    seed: int | None = None  # None: the caller picks one (the engine draws a random seed)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1


@dataclass(frozen=True)
class Pick:
    """What to choose after a sequence's last token: greedy or sampled (params), optionally with
    the log-probabilities of the raw logits (`logprobs`: top-k, 0..20) and a grammar mask
    (`constraint`: fill_mask(ptr, nbytes) -> bool, accept(token)). The hooks need the host every
    token; a plain pick runs inside the decode graph."""

    params: SamplingParams = field(default_factory=SamplingParams)
    logprobs: int | None = None
    constraint: object = None

    @property
    def greedy(self) -> bool:
        return self.params.temperature <= 0 or self.params.top_k == 1

    @property
    def hooked(self) -> bool:
        """Whether the host takes part in every pick (logprobs or a grammar)."""
        return self.logprobs is not None or self.constraint is not None


def splitmix64(x: int) -> int:
    """One SplitMix64 step: the output for state x (all arithmetic mod 2**64)."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def uniform(seed: int, step: int) -> float:
    """The draw for generated token `step` (0-based) of a request seeded with `seed`: a float in
    [0, 1) with 24 random bits, so it is exact in float32 on the GPU too."""
    s = splitmix64(seed & MASK64)
    r = splitmix64(s ^ (step & MASK64))
    return (r >> 40) / 16777216.0


@dataclass
class Sampled:
    """A generated token with what `logprobs` reports (Runner.generate_ids with logprobs=k): the
    log-softmax of the model's logits (before temperature, filters or a grammar mask) for it,
    and the k most likely tokens (larger first, lower id on ties)."""

    token_id: int
    logprob: float
    top_ids: list[int]
    top_logprobs: list[float]
