"""`reflex check` and routing near-ties, on the CPU.

The H200 run of 2026-12-01 failed two DeepSeek-V3 checks: a 770-token prompt in two 512-token
chunks (max relative logit error 0.414 in the prompt rows) and the q5_k file on the short prompt
(0.286 in a decode row, prompt rows 5e-4). Both numbers come back here without a GPU: the numpy
reference, run once more with what the GPU rounds rounded the same way (the latent cache to f16,
the inputs and weights of tensor-core products to f16 for batches past the matrix-vector path;
the router stays float32 as on the GPU), gives 0.4146 and 0.2860, and every row that far off is a
token whose expert choice flipped at a near-tie of the reference's routing. The tiny V3 fixture
(sigmoid scores around 0.5, top-4 of 16 in the 2 best of 4 groups) has many such ties; the
chunking, the latent attention's second chunk and the Q5_K kernels play no part.

check.py therefore excuses a row off by more than the tolerance when the reference's routing there
was closer than the tolerance (`route_margin`), and still fails every other row.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

LONG_PROMPT = " ".join(["Once upon a time there was a small village by the sea, and"] * 55)
PROMPT = "The capital of France is the city of"  # tests/gpu_harness.py's

_CACHE: dict = {}
MODEL_MEMOS = (_CACHE,)  # emptied when this module ends (tests/conftest.py)


def _files(name, outtype):
    """(cpu engine for the tokenizer and file, reference, a second reference for the emulation)."""
    key = (name, outtype)
    if key not in _CACHE:
        from fixtures.deepseek import GPU_CONFIGS
        from fixtures import make_fixture

        from reflex_runtime.families import load_reference
        from reflex_runtime.loader import load_engine

        arch, overrides = GPU_CONFIGS[name]
        path = str(make_fixture(arch, outtype, **overrides).gguf)
        _CACHE[key] = (load_engine(path, "cpu"), load_reference(path), load_reference(path))
    return _CACHE[key]


@contextlib.contextmanager
def _gpu_rounding(n_expert: int, products: bool):
    """The reference's attention reads f16 keys/values (the latent cache); with `products`, every
    matrix product but the router's takes f16 inputs and weights (the tensor-core kernels)."""
    from reflex_runtime.reference import layers

    lin, att = layers.linear, layers.attention

    def f16(a):
        return np.asarray(a, dtype=np.float16).astype(np.float32)

    def linear(x, w):
        return lin(x, w) if not products or w.shape[0] == n_expert else lin(f16(x), f16(w))

    layers.linear = linear
    layers.attention = lambda q, k, v, allowed, scale: att(q, f16(k), f16(v), allowed, scale)
    try:
        yield
    finally:
        layers.linear, layers.attention = lin, att


class EmulatedRunner:
    """CudaRunner's check interface over the reference with the GPU's roundings: prompts in
    MAX_BATCH chunks (tensor-core products from MM_MIN_TOKENS tokens on), decode one token at a
    time (matrix-vector products, float32). `bump`: (row kind, index, amount) adds amount * the
    row's logit range to one logit of that row, a stand-in for a real kernel error."""

    def __init__(self, ref, bump=None):
        self.ref, self.bump = ref, bump
        self.n_expert = ref.config.extra["n_expert"]

    def _forward(self, ids, cache):
        from reflex_runtime.gpu.products import matvec_path
        from reflex_runtime.gpu.runner import MAX_BATCH

        rows = []
        for c0 in range(0, len(ids), MAX_BATCH):
            chunk = ids[c0:c0 + MAX_BATCH]
            with _gpu_rounding(self.n_expert, products=not matvec_path(len(chunk))):
                rows.append(self.ref.forward(chunk, cache))
        return np.concatenate(rows)

    def _bumped(self, kind, j, row):
        if self.bump and self.bump[0] == kind and self.bump[1] == j:
            row = row.copy()
            row[int(np.argmin(row))] += self.bump[2] * float(np.abs(row).max())
        return row

    def prompt_logits(self, ids):
        out = self._forward(ids, self.ref.new_cache(len(ids)))
        return np.stack([self._bumped("prompt", i, r) for i, r in enumerate(out)])

    def _rows(self, ids, forced):
        cache = self.ref.new_cache(len(ids) + len(forced) + 1)
        rows = [self._forward(ids, cache)[-1]]
        for tok in forced:
            rows.append(self._forward([tok], cache)[0])
        return rows

    def decode_logits(self, ids, forced):
        return [self._bumped("decode", j, r) for j, r in enumerate(self._rows(ids, forced))]

    def generate_ids(self, ids, params, steps, stop_ids):
        cache = self.ref.new_cache(len(ids) + steps + 1)
        row = self._bumped("decode", 0, self._forward(ids, cache)[-1])
        for j in range(steps):
            tok = int(np.argmax(row))
            yield tok
            if j + 1 < steps:
                row = self._bumped("decode", j + 1, self._forward([tok], cache)[0])


class EmulatedEngine:
    def __init__(self, cpu_engine, runner):
        self.gguf, self.config, self.runner = cpu_engine.gguf, cpu_engine.config, runner
        self._cpu = cpu_engine

    def prompt_ids(self, prompt):
        return self._cpu.prompt_ids(prompt)

    def generate(self, request):
        return iter(())


def _check(name, outtype, prompt, steps, bump=None):
    from reflex_runtime.commands.check import run_check

    cpu, ref, emu_ref = _files(name, outtype)
    return run_check(EmulatedEngine(cpu, EmulatedRunner(emu_ref, bump)), ref, prompt, steps)


def test_route_margin_measures_the_closest_routing_decision():
    """Against brute force on V3's rule (sigmoid + bias, top-2-sum groups, 1 of 2 kept, top 2)."""
    from reflex_runtime.families.deepseek2.reference import route, route_margin

    e = dict(gating="sigmoid", n_group=2, n_group_used=1, group_score="top2", n_expert_used=2, weights_norm=True,
             weights_scale=2.5)
    rng = np.random.default_rng(7)
    logits = rng.standard_normal((50, 8)).astype(np.float32)
    bias = (rng.standard_normal(8) * 0.1).astype(np.float32)
    logits[0, :4], logits[0, 4:] = -5.0, 1.0  # group 1 kept, its experts tied: margin 0
    bias[4:] = 0.0
    ids, _ = route(logits, e, bias)
    m = route_margin(logits, e, bias)
    choice = (1.0 / (1.0 + np.exp(-logits)) + bias).astype(np.float64)
    for t in range(50):
        per = choice[t].reshape(2, 4)
        gs = np.sort(per, axis=1)[:, -2:].sum(axis=1)
        kept = 0 if gs[0] >= gs[1] else 1
        ranked = np.sort(per[kept])[::-1]
        want = min(abs(gs[0] - gs[1]), ranked[1] - ranked[2]) / np.abs(choice[t]).max()
        assert m[t] == pytest.approx(want, rel=1e-4, abs=1e-6), t
        assert set(ids[t]) <= set(range(4 * kept, 4 * kept + 4))
    assert m[0] == 0.0
    # nothing left out: no decision, no margin
    e_all = dict(e, n_group=1, n_group_used=1, n_expert_used=8)
    assert np.isinf(route_margin(logits, e_all, None)).all()


def test_reference_reports_route_margins_per_row_of_the_last_forward():
    _, ref, _ = _files("v3", "q8_0")
    ids = list(range(1000, 1007))
    cache = ref.new_cache(16)
    ref.forward(ids, cache)
    assert ref.route_margin.shape == (7,) and np.isfinite(ref.route_margin).all() and (ref.route_margin >= 0).all()
    ref.forward([5], cache)
    assert ref.route_margin.shape == (1,)


def test_long_v3_prompt_fails_only_at_routing_ties():
    """The H200's 0.41 (v3, 770 tokens, q8_0): every row that far off is a routing near-tie, in
    the first chunk as well as the second; the check excuses those rows and passes."""
    res = _check("v3", "q8_0", LONG_PROMPT, 4)
    assert res["prompt_tokens"] == 770
    assert res["max_rel_err_prompt"] == pytest.approx(0.41, abs=0.01)  # the H200 printed 0.4142
    ties = res["routing_tie_rows"]["prompt"]
    assert 548 in ties and any(i < 512 for i in ties), ties  # both chunks: not the chunking
    assert res["max_rel_err_checked"] <= res["tolerance"]
    assert res["result"] == "PASS", {k: v for k, v in res.items() if "tokens" not in k}


def test_v3_q5_k_decode_row_is_a_routing_tie():
    """The H200's v3 q5_k FAIL (prompt 5.2e-4, decode 0.286): the decode row after the 6th
    token flips an expert at a near-tie (the f16 cache alone moves it); excused, the check passes."""
    res = _check("v3", "q5_k", PROMPT, 8)
    assert res["max_rel_err_prompt"] < 1e-3
    assert res["max_rel_err_decode"] == pytest.approx(0.286, abs=0.005)  # the H200 printed 0.28599
    assert res["routing_tie_rows"] == {"prompt": [], "decode": [6]}
    assert res["result"] == "PASS", {k: v for k, v in res.items() if "tokens" not in k}


def test_generated_tokens_are_compared_up_to_a_greedy_near_tie():
    """The H200's v3_wide q4_k_m FAIL (2026-12-03): every row within 7e-4 of the reference, but
    the reference's decode row 7 has its top two logits closer than twice that, and the generated
    token there went the other way. The check now compares generated tokens up to such a row (as
    it already excused the teacher-forced token there) and reports it."""
    res = _check("v3_wide", "q4_k_m", PROMPT, 8)
    assert res["max_rel_err_checked"] < 1e-3 and res["greedy_near_tie_rows"] == [7]
    assert res["result"] == "PASS", {k: v for k, v in res.items() if "tokens" not in k}


def test_topk_margin_is_the_last_choice_over_the_first_unchosen():
    """blocks.topk_margin (Qwen3-MoE, Qwen3.5-MoE): (p_k - p_k+1) / p_1 of the softmax, per row."""
    from reflex_runtime.reference.blocks import softmax_topk, topk_margin

    rng = np.random.default_rng(3)
    logits = rng.standard_normal((40, 8)).astype(np.float32)
    logits[:2] = np.clip(logits[:2], -2.0, 2.0)
    logits[0, 2] = logits[0, 5] = 3.0  # the 1st and 2nd choices tied: not a decision at k = 2 ...
    logits[1, 2] = logits[1, 5] = 3.0
    logits[1, 6] = 4.0  # ... but the 2nd and 3rd are at k = 2 here: margin 0
    m = topk_margin(logits, 2)
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    for t in range(40):
        r = np.sort(p[t])[::-1]
        assert m[t] == pytest.approx((r[1] - r[2]) / r[0], rel=1e-5, abs=1e-7)
        assert set(softmax_topk(logits[t:t + 1], 2)[0][0]) == set(np.argsort(-p[t], kind="stable")[:2])
    assert m[0] > 0.01 and m[1] == 0.0
    assert np.isinf(topk_margin(logits, 8)).all()


def test_long_qwen35moe_prompt_fails_only_at_routing_ties():
    """The H200's one failure of 2026-12-03 (s18 call 5: test_long_prompt_crosses_batches_and_chunks
    [qwen35moe], max relative error 0.40 in a prompt row): the same emulation on the Qwen3.5-MoE
    fixture (softmax top-2 of 8) gives 0.41, only at rows whose expert choice was a near-tie, which
    the check now excuses because the Qwen3.5-MoE reference reports its routing margins too."""
    from fixtures import make_fixture

    from reflex_runtime.commands.check import run_check
    from reflex_runtime.families import load_reference
    from reflex_runtime.loader import load_engine

    path = str(make_fixture("qwen35moe", "q8_0").gguf)
    cpu, ref, emu = load_engine(path, "cpu"), load_reference(path), load_reference(path)
    res = run_check(EmulatedEngine(cpu, EmulatedRunner(emu)), ref, LONG_PROMPT, 4)
    assert res["prompt_tokens"] > 512
    assert res["max_rel_err_prompt"] > 0.1 and res["routing_tie_rows"]["prompt"], res["routing_tie_rows"]
    assert res["max_rel_err_checked"] <= res["tolerance"]
    assert res["result"] == "PASS", {k: v for k, v in res.items() if "tokens" not in k}


@pytest.mark.parametrize("kind", ["prompt", "decode"])
def test_an_error_away_from_a_tie_still_fails(kind):
    """A row whose routing had room (margin above the tolerance) is held to the tolerance."""
    from reflex_runtime.commands.check import TOLERANCES

    cpu, ref, _ = _files("v3", "q5_k")
    ids = cpu.prompt_ids(PROMPT)
    cache = ref.new_cache(len(ids) + 9)
    row = ref.forward(ids, cache)[-1]
    margins = list(ref.route_margin)
    if kind == "decode":  # run_check's decode rows: the prompt's last, then one per greedy token
        margins = [margins[-1]]
        for _ in range(8):
            row = ref.forward([int(np.argmax(row))], cache)[0]
            margins.append(ref.route_margin[0])
    row = int(np.argmax(margins[:8]))
    assert margins[row] > TOLERANCES["Q5_K"]
    res = _check("v3", "q5_k", PROMPT, 8, bump=(kind, row, 0.05))
    assert row not in res["routing_tie_rows"][kind]
    assert res["result"] == "FAIL"
