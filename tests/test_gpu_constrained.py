"""logprobs and grammar masks on the GPU (kernels/constrain.cu, gpu/constrained.py).

- The kernels against numpy on fresh random rows of awkward lengths, outputs NaN-poisoned first:
  the slices' logsumexp and top k (ties and -inf entries included) merged as the runner merges
  them equal reference/sampling.py token_logprobs; the mask sets exactly the cleared bits to -inf.
  tests/test_constrain_host.py runs the same checks with the kernels compiled for the CPU.
- The CUDA runner with logprobs and a grammar equals the numpy reference runner on the tiny
  Qwen3 fixture: the same tokens, logprobs within 2e-3 (the forward passes differ in float
  rounding), every token inside the grammar.

Run on a GPU machine: pytest -m gpu tests/test_gpu_constrained.py
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from reflex_runtime.gpu.constrained import merge_stats
from reflex_runtime.gpu.ops import constrain
from reflex_runtime.gpu.ops.constrain import STATS_PARTS, STATS_TOPK
from reflex_runtime.reference.sampling import token_logprobs


ROW_LENGTHS = [1, 45, 4099, 50_001]  # the host run keeps to these; the GPU adds vocabulary sizes
K_VALUES = [0, 1, 7, STATS_TOPK]


def _row(n: int, rng) -> np.ndarray:
    x = (rng.normal(size=n) * 4).astype(np.float32)
    if n > 10:
        x[rng.integers(0, n, size=n // 10)] = x[rng.integers(0, n)]  # ties, across slices
        x[rng.integers(0, n, size=4)] = x.max()  # ties at the top: the lower id comes first
        x[rng.integers(0, n, size=3)] = -np.inf  # a grammar's masked entries
    return x


def check_logit_stats(h, n: int, k: int, parts: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = _row(n, rng)
    xp = h.put(x)
    pf = h.poisoned((parts, 2 + STATS_TOPK))
    pi = h.poisoned((parts, STATS_TOPK), np.int32)
    constrain.logit_stats(h.launch, xp, n, k, pf, pi, parts)
    h.sync()
    part_f, part_i = h.get(pf, (parts, 2 + STATS_TOPK)), h.get(pi, (parts, STATS_TOPK), np.int32)
    assert not np.isnan(part_f[:, :2]).any()
    lse, ids, vals = merge_stats(part_f, part_i, k)
    tok = int(rng.integers(0, n))
    want_lp, want_ids, want_lps = token_logprobs(x, tok, k)
    assert abs((float(x[tok]) - lse) - want_lp) < 1e-4 or (np.isinf(want_lp) and np.isinf(x[tok]))
    assert ids == want_ids[:len(ids)] and len(ids) == min(k, n)
    np.testing.assert_allclose(np.array(vals) - lse, want_lps, atol=1e-4)


def check_mask(h, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n).astype(np.float32)
    allow = rng.random(n) < 0.3
    words = np.packbits(np.concatenate([allow, np.zeros(-n % 32, bool)]), bitorder="little").view("<u4")
    xp = h.put(x)
    constrain.mask_logits(h.launch, xp, h.put(words), n)
    h.sync()
    got = h.get(xp, (n,))
    assert np.array_equal(got[allow], x[allow]) and np.isneginf(got[~allow]).all()


def check_token_logit(h, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n).astype(np.float32)
    tok = int(rng.integers(0, n))
    out = h.poisoned((1,))
    constrain.token_logit(h.launch, h.put(x), h.put(np.array([tok], np.int32)), out)
    h.sync()
    assert h.get(out, (1,))[0] == x[tok]


# -- on the GPU ------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("n", ROW_LENGTHS + [151_936, 262_145])
@pytest.mark.parametrize("k", K_VALUES)
@pytest.mark.parametrize("parts", [1, 7, STATS_PARTS])
def test_logit_stats(gpu, n, k, parts):
    check_logit_stats(gpu, n, k, parts, seed=n * 31 + k * 7 + parts)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 33, 151_936, 262_145])
def test_mask_and_token_logit(gpu, n):
    check_mask(gpu, n, seed=n)
    check_token_logit(gpu, n, seed=n + 1)


# Every output this schema admits is short (a name of at most 8 characters, a two-digit number),
# so a grammar-constrained run finishes well inside MAX_NEW whatever the random weights prefer.
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "n"],
          "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer", "minimum": 0, "maximum": 99}}}
MAX_NEW = 40
MAX_EXCUSED = 3  # near-tie steps allowed out of MAX_NEW: more means the backends really differ


@pytest.fixture(scope="module")
def qwen3_pair():
    from fixtures import make_fixture

    from reflex_runtime.loader import load_engine

    path = str(make_fixture("qwen3", "q8_0").gguf)
    return load_engine(path, "cuda"), load_engine(path, "cpu")


def _constraint(eng):
    from reflex_runtime.text.grammar import Grammar

    return Grammar.json_schema(PERSON, "schema").constraint(eng.tokenizer, eng.config.vocab_size,
                                                           frozenset([eng.tokenizer.eos_id]))


@pytest.mark.gpu
@pytest.mark.parametrize("with_grammar", [False, True])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_cuda_runner_logprobs_and_grammar_equal_the_reference(qwen3_pair, with_grammar, temperature):
    """Teacher-forced against the reference (tests/teacher_forced.py): each GPU token is the
    reference's pick or a near-tie the reference's own numbers show, logprobs within 2e-3."""
    from teacher_forced import compare

    from reflex_runtime.sampling import SamplingParams

    cuda, cpu = qwen3_pair
    ids = cuda.prompt_ids("Write a person as JSON:")
    params = SamplingParams(temperature, seed=5)
    c_gpu = _constraint(cuda) if with_grammar else None
    got = list(cuda.runner.generate_ids(ids, params, MAX_NEW, frozenset(), logprobs=5, constraint=c_gpu))
    verdict = compare(cpu.runner.model, ids, got, params, _constraint(cpu) if with_grammar else None, logprobs=5)
    assert verdict.excused <= MAX_EXCUSED, verdict
    if with_grammar:
        text = cuda.tokenizer.decode([s.token_id for s in got if s.token_id != cuda.tokenizer.eos_id])
        assert c_gpu.finished and isinstance(json.loads(text), dict), text
    # the plain loop still runs after the checked one (graphs of both kinds kept apart)
    plain = list(cuda.runner.generate_ids(ids, SamplingParams(), 8, frozenset()))
    assert compare(cpu.runner.model, ids, plain, SamplingParams()).excused <= 1
