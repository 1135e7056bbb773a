"""tests/teacher_forced.py, the judge the GPU tests use against the reference: it passes the
reference's own output with nothing excused, excuses exactly the near-ties (equal logits, a draw
on a boundary) and nothing else, and fails a wrong token, a token outside the grammar and a wrong
logprob."""

from __future__ import annotations

import json

import numpy as np
import pytest
from teacher_forced import compare

from reflex_runtime.sampling import Sampled, SamplingParams, uniform


class TableModel:
    """A stand-in reference whose logits row j is rows[j], whatever the tokens."""

    def __init__(self, rows):
        self.rows = np.asarray(rows, dtype=np.float32)

    def new_cache(self, n):
        return None

    def forward(self, ids, cache):
        return self.rows[: len(ids)]


def test_greedy_near_tie_is_excused_and_a_clear_loser_is_not():
    row = np.array([0.0, 5.0, 5.0 - 1e-4, 1.0], np.float32)  # 1 and 2 tie within the rounding
    model = TableModel([row, row])
    v = compare(model, [9], [2, 1], SamplingParams())  # step 0 took the near-tied 2
    assert v.pick_ties == [0] and v.excused == 1
    with pytest.raises(AssertionError, match="not a near-tie"):
        compare(model, [9], [3, 1], SamplingParams())


def test_draw_on_a_boundary_is_excused_and_one_inside_a_token_is_not():
    params = SamplingParams(1.0, seed=11)
    u = uniform(11, 0)
    # token 0's share ends at u + 1e-4: the draw falls just inside it, next to token 1's share
    p = np.array([u + 1e-4, 1 - u - 1e-4], np.float64)
    row = np.log(p).astype(np.float32)
    model = TableModel([row])
    assert compare(model, [9], [0], params).excused == 0
    assert compare(model, [9], [1], params).pick_ties == [0]
    far = np.log(np.array([min(u + 0.3, 0.99), 1 - min(u + 0.3, 0.99)])).astype(np.float32)
    with pytest.raises(AssertionError, match="not a near-tie"):
        compare(TableModel([far]), [9], [1], params)


def test_logprobs_and_top_ids_are_checked():
    row = np.array([3.0, 1.0, 1.0, 0.5, -2.0], np.float32)  # ids 1 and 2 tie exactly
    model = TableModel([row])
    lp = row.astype(np.float64) - np.log(np.exp(row.astype(np.float64)).sum())
    good = Sampled(0, float(lp[0]), [0, 2, 1], [float(lp[0]), float(lp[2]), float(lp[1])])
    assert compare(model, [9], [good], SamplingParams(), logprobs=3).top_ties == [0]
    wrong_lp = Sampled(0, float(lp[0]) + 0.01, [0, 1, 2], [float(lp[0]), float(lp[1]), float(lp[2])])
    with pytest.raises(AssertionError):
        compare(model, [9], [wrong_lp], SamplingParams(), logprobs=3)
    wrong_id = Sampled(0, float(lp[0]), [0, 3, 1], [float(lp[0]), float(lp[1]), float(lp[2])])
    with pytest.raises(AssertionError, match="top id 1"):
        compare(model, [9], [wrong_id], SamplingParams(), logprobs=3)


@pytest.fixture(scope="module")
def qwen3_cpu(fixture_paths):
    from reflex_runtime.loader import load_engine

    return load_engine(str(fixture_paths("qwen3", "q8_0").gguf), "cpu")


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_the_reference_against_itself_excuses_nothing_and_the_schema_finishes(qwen3_cpu, temperature):
    """What tests/test_gpu_constrained.py runs on the GPU, with the reference on both sides: every
    step agrees, and the bounded schema's output is complete JSON within its token budget."""
    from test_gpu_constrained import MAX_NEW, _constraint

    eng = qwen3_cpu
    ids = eng.prompt_ids("Write a person as JSON:")
    params = SamplingParams(temperature, seed=5)
    c = _constraint(eng)
    got = list(eng.runner.generate_ids(ids, params, MAX_NEW, frozenset(), logprobs=5, constraint=c))
    assert c.finished, eng.tokenizer.decode([s.token_id for s in got])
    assert isinstance(json.loads(eng.tokenizer.decode([s.token_id for s in got if s.token_id != eng.tokenizer.eos_id])), dict)
    v = compare(eng.runner.model, ids, got, params, _constraint(eng), logprobs=5)
    assert v.steps == len(got) and v.excused == 0
    # a token outside the grammar is caught even where the logits would allow it
    bad = list(got)
    bad[0] = Sampled(eng.tokenizer.eos_id, 0.0, [], [])
    with pytest.raises(AssertionError, match="outside the grammar"):
        compare(eng.runner.model, ids, bad, params, _constraint(eng), logprobs=5)
