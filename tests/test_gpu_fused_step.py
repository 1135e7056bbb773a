"""The decode step as one persistent kernel (gpu/fused.py, kernels/fused_step.cu; REFLEX_FUSED_STEP=1)
against the numpy reference and against the kernel-per-op step it replaces: `reflex check` (its
decode logits come from the fused kernel, its generate from the fused graph) on every weight type
of the dense families, greedy tokens after a long context (the attention split and merged inside
it), and the kernel-per-op step's logits to float rounding and its seeded samples.

Run on a GPU machine: pytest -m gpu tests/test_gpu_fused_step.py
"""

import numpy as np
import pytest

from gpu_harness import FIXTURE_TYPES, PROMPT, reference_greedy
from reflex_runtime.gpu.launch import FUSED_KNOBS

pytestmark = pytest.mark.gpu

CHECK_PROMPT = "one two three four five six seven eight nine ten eleven"


# kernels/fused_step.cu's options (Launcher knobs, all on by default): none, each alone, all
PLAIN = dict.fromkeys(FUSED_KNOBS, False)
KNOBS = {"plain": PLAIN, **{o.removeprefix("fused_"): {**PLAIN, o: True} for o in FUSED_KNOBS},
         "all": dict.fromkeys(FUSED_KNOBS, True)}


def fused_engine(arch, outtype, knobs=(), **overrides):
    from fixtures import make_fixture
    from reflex_runtime.loader import load_engine

    eng = load_engine(str(make_fixture(arch, outtype, **overrides).gguf), "cuda")
    eng.runner.launch.fused_step = True
    for k, v in dict(knobs).items():
        assert hasattr(eng.runner.launch, k), k
        setattr(eng.runner.launch, k, v)
    eng.runner.reset_graphs()
    return eng


def _check(eng, steps=8):
    from reflex_runtime.commands.check import run_check
    from reflex_runtime.families import load_reference

    res = run_check(eng, load_reference(eng.gguf, eng.config), CHECK_PROMPT, steps)
    assert eng.runner.info()["decode_fused_step"] is True, eng.runner.info()
    return res


@pytest.mark.parametrize("arch,outtype", [("qwen3", t) for t in FIXTURE_TYPES]
                         + [("gemma3", "f32"), ("gemma3", "q4_k_m"), ("llama", "q8_0"), ("llama", "q4_k_m")])
def test_check_passes_with_the_fused_step(arch, outtype):
    res = _check(fused_engine(arch, outtype), 12 if arch == "gemma3" else 8)  # gemma: past its window of 8
    assert res["result"] == "PASS", {k: v for k, v in res.items() if "tokens" not in k}


def test_check_passes_with_the_fused_step_llama3_rope_factors():
    """A tied Llama 3 with per-pair rope frequency factors, Q4_1 (no fast row decoder: the other lane layout)."""
    res = _check(fused_engine("llama", "q4_1", tie_word_embeddings=True, rope_llama3=4.0))
    assert res["result"] == "PASS", {k: v for k, v in res.items() if "tokens" not in k}


def test_check_passes_with_the_fused_step_odd_layer_count():
    """Three layers: the sampled program (reflex check's logits) starts past an odd number of
    layers' ops in the arena."""
    res = _check(fused_engine("qwen3", "q8_0", num_hidden_layers=3))
    assert res["result"] == "PASS", {k: v for k, v in res.items() if "tokens" not in k}


def _logits_equal_the_kernel_per_op_step(eng):
    ids = eng.prompt_ids(PROMPT)
    forced = [int(t) for t in (np.arange(12) * 37 + 5) % eng.config.vocab_size]
    fused = eng.runner.decode_logits(ids, forced)
    # the kernel-per-op step with Gemma's post-norms as norm launches: the fused step's norm ops and
    # folds sum as reflex_rmsnorm does; the graph's own fold (mvs_post_x) sums in another order
    eng.runner.launch.fused_step = eng.runner.launch.post_fold = False
    eng.runner.reset_graphs()
    plain = eng.runner.decode_logits(ids, forced)
    for a, b in zip(fused, plain):
        assert np.isfinite(a).all() and int(np.argmax(a)) == int(np.argmax(b))
        # float rounding through every layer: the two programs inline the same bodies, and the compiler
        # contracts multiply-adds differently in each (s29: up to 2e-5 of the largest logit)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4 * float(np.abs(b).max()))


def test_fused_step_logits_equal_the_kernel_per_op_step():
    """Qwen3 Q4_K_M (mixed types: Q6_K rows among Q4_K): every decode step's logits equal the
    kernel-per-op step's to float rounding (the same sums in the same order; the compiler may
    contract a multiply-add differently where the bodies are inlined), and so does each pick."""
    _logits_equal_the_kernel_per_op_step(fused_engine("qwen3", "q4_k_m"))


@pytest.mark.parametrize("knobs", list(KNOBS))
@pytest.mark.parametrize("arch,outtype", [("qwen3", "q4_k_m"), ("qwen3", "q8_0"), ("gemma3", "q4_k_m"),
                                          ("llama", "q4_1")])
def test_fused_step_knobs_pass_check_and_keep_the_logits(arch, outtype, knobs):
    """The kernel's flags: x copied into shared memory ahead of the next op's weights, with its norm
    weights staged an op earlier (x_early: the same sums from shared memory), the output projection's
    and Gemma's gate/up tiles staged past the op before them (lookahead), the attention's first item
    begun before the barrier that ends q/k/v (attn_early), a KV head's query heads shared by several
    blocks (attn_groups: Gemma's 4 on 4 blocks), Gemma's post-norms folded into the next matrix op
    (fold_norms: the residual alternating x / h). `reflex check` PASS, and the logits equal
    the kernel-per-op step's as without them: Q4_K_M's mixed q/k/v, Q8_0, Gemma's post-norms and
    unnormalized inputs and sliding window, Q4_1's other lane layout."""
    eng = fused_engine(arch, outtype, KNOBS[knobs])
    res = _check(eng, 12 if arch == "gemma3" else 8)
    assert res["result"] == "PASS", {k: v for k, v in res.items() if "tokens" not in k}
    _logits_equal_the_kernel_per_op_step(eng)


@pytest.mark.parametrize("knobs", ["plain", "all"])
def test_fused_step_greedy_and_seeded_sampling_after_a_long_context(knobs):
    """After ~1,200 tokens (the attention in ~38 slices per KV head, merged inside the kernel): 8
    greedy tokens equal the reference's; seeded sampling gives the kernel-per-op step's tokens.
    Also with the kernel's flags on."""
    from reflex_runtime.families import load_reference
    from reflex_runtime.sampling import SamplingParams

    eng = fused_engine("qwen3", "q8_0", KNOBS.get(knobs, {}))
    ref = load_reference(eng.gguf, eng.config)
    ids = eng.prompt_ids(" ".join(["Once upon a time there was a small village by the sea, and"] * 110))
    assert len(ids) > 1000
    assert list(eng.runner.generate_ids(ids, SamplingParams(), 8, frozenset())) == reference_greedy(ref, ids, 8)
    p = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=7)
    short = eng.prompt_ids(PROMPT)
    fused = list(eng.runner.generate_ids(short, p, 24, frozenset()))
    eng.runner.launch.fused_step = False
    eng.runner.reset_graphs()
    assert list(eng.runner.generate_ids(short, p, 24, frozenset())) == fused
