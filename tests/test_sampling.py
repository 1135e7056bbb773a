"""The sampling semantics of docs/INTERNALS.md, rule by rule, against the reference sampler.

Expected kept sets are computed here by brute force straight from the rule text (loops over
tokens, float64), independently of the vectorized implementation under test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from reflex_runtime.reference.sampling import filter_mask, kept_probabilities, sample
from reflex_runtime.sampling import MASK64, SamplingParams, splitmix64, uniform

# -- the random draw ---------------------------------------------------------------------------


def test_splitmix64_published_vectors():
    # Vigna's reference SplitMix64 seeded with 0 outputs these first two values; our
    # splitmix64(x) is the output for state x, so state 0 and state 0 + golden gamma.
    assert splitmix64(0) == 0xE220A8397B1DCDAF
    assert splitmix64(0x9E3779B97F4A7C15) == 0x6E789E6AA1B965F4


def test_splitmix64_matches_uint64_arithmetic():
    rng = np.random.default_rng(0)
    xs = rng.integers(0, 2**63, size=200, dtype=np.uint64) * np.uint64(2) + rng.integers(0, 2, size=200, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = xs + np.uint64(0x9E3779B97F4A7C15)
        z = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    assert [splitmix64(int(v)) for v in xs] == [int(v) for v in z]
    assert all(0 <= splitmix64(int(v)) <= MASK64 for v in xs)


def test_uniform_definition_range_and_determinism():
    for seed in (0, 1, 42, 2**63 - 1, 2**64 - 1):
        for step in (0, 1, 2, 1000, 2**40):
            u = uniform(seed, step)
            r = splitmix64(splitmix64(seed) ^ step)
            assert u == (r >> 40) / 2**24
            assert 0.0 <= u < 1.0
            assert u * 2**24 == int(u * 2**24)  # exactly 24 bits: representable in float32
            assert uniform(seed, step) == u
    assert len({uniform(7, s) for s in range(1000)}) > 990
    assert [uniform(1, s) for s in range(8)] != [uniform(2, s) for s in range(8)]


def test_uniform_is_uniform():
    u = np.array([uniform(123, s) for s in range(20000)])
    counts = np.histogram(u, bins=20, range=(0, 1))[0]
    expected = len(u) / 20
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 43.8  # chi-square, 19 dof, p = 0.001


# -- rule 1: greedy ------------------------------------------------------------------------------


def test_greedy_when_temperature_is_zero_or_top_k_is_one():
    logits = np.array([0.5, 3.0, -1.0, 2.9], dtype=np.float32)
    for params in (SamplingParams(), SamplingParams(temperature=0.0, seed=5), SamplingParams(temperature=-1.0),
                   SamplingParams(temperature=1.5, top_k=1, seed=9)):
        assert all(sample(logits, params, step) == 1 for step in range(20))


def test_greedy_ties_go_to_the_lowest_id():
    logits = np.array([1.0, 4.0, 2.0, 4.0, 4.0], dtype=np.float32)
    assert sample(logits, SamplingParams(), 0) == 1
    assert sample(logits, SamplingParams(temperature=1.0, top_k=1, seed=3), 0) == 1


# -- rules 2-5: the kept set -------------------------------------------------------------------


def brute_kept(logits, params) -> set[int]:
    """The rules read literally, in float64 over plain Python loops."""
    z = [float(np.float32(v) / np.float32(params.temperature)) for v in logits]
    zmax = max(z)
    p = [math.exp(v - zmax) for v in z]
    kept = set(range(len(z)))
    if params.top_k > 0:
        t_k = sorted(z, reverse=True)[min(params.top_k, len(z)) - 1]
        kept = {i for i in kept if z[i] >= t_k}
    if params.top_p < 1.0:
        total = sum(p[i] for i in kept)
        t_p = None
        for v in sorted({z[i] for i in kept}, reverse=True):
            mass = sum(p[i] for i in kept if z[i] >= v)
            if mass >= params.top_p * total:
                t_p = v  # the first (largest) value that reaches the mass
                break
        kept = {i for i in kept if z[i] >= t_p}
    if params.min_p > 0.0:
        kept = {i for i in kept if z[i] >= zmax + math.log(params.min_p)}
    return kept


def kept_set(logits, params) -> set[int]:
    keep, _ = filter_mask(np.asarray(logits, dtype=np.float32), params)
    return set(np.flatnonzero(keep).tolist())


def test_top_k_keeps_the_k_largest_and_all_ties_at_the_kth():
    logits = np.array([1.0, 5.0, 3.0, 3.0, 2.0, 3.0, 0.0], dtype=np.float32)
    assert kept_set(logits, SamplingParams(temperature=1.0, top_k=2)) == {1, 2, 3, 5}  # t_k = 3: ties kept
    assert kept_set(logits, SamplingParams(temperature=1.0, top_k=5)) == {1, 2, 3, 4, 5}
    assert kept_set(logits, SamplingParams(temperature=1.0, top_k=100)) == set(range(7))
    assert kept_set(logits, SamplingParams(temperature=1.0, top_k=0)) == set(range(7))


def test_top_p_threshold_from_the_definition():
    # p = [0.5, 0.25, 0.125, 0.125] after normalization (temperature 1, log-probabilities)
    logits = np.log(np.array([0.25, 0.5, 0.125, 0.125])).astype(np.float32)
    t = SamplingParams(temperature=1.0, top_p=0.5)
    assert kept_set(logits, t) == {1}  # mass at or above 0.5 is exactly 0.5 >= 0.5
    assert kept_set(logits, SamplingParams(temperature=1.0, top_p=0.6)) == {0, 1}
    assert kept_set(logits, SamplingParams(temperature=1.0, top_p=0.76)) == {0, 1, 2, 3}  # ties at t_p kept
    assert kept_set(logits, SamplingParams(temperature=1.0, top_p=1e-9)) == {1}


def test_top_p_applies_among_top_k_kept_tokens():
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1])).astype(np.float32)
    # among the top 2 (mass 0.7), 0.5 of it is 0.35: token 0 alone (0.4) reaches it
    assert kept_set(logits, SamplingParams(temperature=1.0, top_k=2, top_p=0.5)) == {0}
    # without top-k, 0.5 of 1.0 needs tokens 0 and 1
    assert kept_set(logits, SamplingParams(temperature=1.0, top_p=0.5)) == {0, 1}


def test_min_p_relative_to_the_max():
    logits = np.log(np.array([0.5, 0.3, 0.1, 0.05, 0.05])).astype(np.float32)
    # p_i / p_max = 1, 0.6, 0.2, 0.1, 0.1
    assert kept_set(logits, SamplingParams(temperature=1.0, min_p=0.15)) == {0, 1, 2}
    assert kept_set(logits, SamplingParams(temperature=1.0, min_p=0.7)) == {0}
    assert kept_set(logits, SamplingParams(temperature=1.0, min_p=0.05)) == set(range(5))


def test_temperature_scales_before_filtering():
    logits = np.array([2.0, 1.0, 0.0], dtype=np.float32)
    # at T=1, p ratios 1, e^-1, e^-2; at T=0.25 they are 1, e^-4, e^-8
    assert kept_set(logits, SamplingParams(temperature=1.0, min_p=0.1)) == {0, 1, 2}
    assert kept_set(logits, SamplingParams(temperature=0.25, min_p=0.1)) == {0}


@pytest.mark.parametrize("trial", range(40))
def test_kept_set_matches_brute_force(trial):
    rng = np.random.default_rng(trial)
    n = int(rng.integers(2, 60))
    logits = (rng.standard_normal(n) * rng.uniform(0.5, 4)).astype(np.float32)
    if trial % 3 == 0:  # plenty of exact ties
        logits = np.round(logits).astype(np.float32)
    params = SamplingParams(
        temperature=float(rng.choice([0.3, 0.7, 1.0, 1.8])),
        top_k=int(rng.choice([0, 0, 1 + int(rng.integers(1, n + 3))])),
        top_p=float(rng.choice([1.0, 0.9, 0.5, 0.2])),
        min_p=float(rng.choice([0.0, 0.0, 0.05, 0.3])),
        seed=trial,
    )
    assert kept_set(logits, params) == brute_kept(logits, params)


# -- rule 6: the draw ----------------------------------------------------------------------------


def brute_draw(logits, params, step) -> int:
    keep, p = filter_mask(np.asarray(logits, dtype=np.float32), params)
    ids = [i for i in range(len(logits)) if keep[i]]
    total = sum(float(p[i]) for i in ids)
    target = uniform(params.seed, step) * total
    running = 0.0
    for i in ids:  # token-id order
        running += float(p[i])
        if running > target:
            return i
    return ids[-1]


@pytest.mark.parametrize("trial", range(20))
def test_draw_walks_kept_tokens_in_id_order(trial):
    rng = np.random.default_rng(100 + trial)
    logits = rng.standard_normal(50).astype(np.float32) * 2
    params = SamplingParams(temperature=0.9, top_k=20, top_p=0.9, min_p=0.01, seed=trial * 7919)
    for step in range(30):
        tok = sample(logits, params, step)
        assert tok == brute_draw(logits, params, step)
        assert kept_probabilities(logits, params)[tok] > 0


def test_draw_boundaries_use_strict_greater_than():
    # two kept tokens of equal p: u < 0.5 picks the first, u >= 0.5 the second
    logits = np.zeros(2, dtype=np.float32)
    params = SamplingParams(temperature=1.0, seed=0)
    for step in range(200):
        u = uniform(0, step)
        assert sample(logits, params, step) == (0 if u < 0.5 else 1)


def test_seeded_determinism_and_seed_dependence():
    logits = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    a = [sample(logits, SamplingParams(temperature=1.0, seed=42), s) for s in range(64)]
    b = [sample(logits, SamplingParams(temperature=1.0, seed=42), s) for s in range(64)]
    c = [sample(logits, SamplingParams(temperature=1.0, seed=43), s) for s in range(64)]
    assert a == b
    assert a != c
    assert len(set(a)) > 10


def test_sample_is_independent_of_input_dtype_and_layout():
    logits = np.random.default_rng(2).standard_normal(300).astype(np.float32)
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=5)
    ref = [sample(logits, params, s) for s in range(20)]
    assert [sample(logits.astype(np.float64), params, s) for s in range(20)] == ref
    assert [sample(np.repeat(logits, 2)[::2], params, s) for s in range(20)] == ref


def test_draw_frequencies_follow_the_kept_distribution():
    logits = np.log(np.array([0.05, 0.4, 0.1, 0.3, 0.15, 0.001])).astype(np.float32)
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=2024)
    probs = kept_probabilities(logits, params)
    assert probs[5] == 0 and probs[0] == 0  # 0.9 of the mass (1.001) needs 0.4+0.3+0.15+0.1 only
    n = 20000
    counts = np.bincount([sample(logits, params, s) for s in range(n)], minlength=6)
    assert counts[0] == counts[5] == 0
    kept = probs > 0
    expected = probs[kept] * n
    chi2 = (((counts[kept] - expected) ** 2) / expected).sum()
    assert chi2 < 16.27  # chi-square, 3 dof, p = 0.001
