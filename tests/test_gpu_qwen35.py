"""Qwen3.5 on the GPU: every Gated DeltaNet and gate kernel against the numpy reference's own
functions (families/qwen35/delta_net.py, reference.py) on fresh random inputs at awkward sizes
(head sizes not multiples of 32, sequences across chunk boundaries, several sequences in one
batch), outputs NaN-poisoned first and the state of a new sequence (position 0) poisoned too, so
a kernel that reads it shows. Then the engine against the reference on tiny converter-made
fixtures of every weight type: `reflex check`, greedy generation, system1 in one batched pass.

Run on a GPU machine: pytest -m gpu tests/test_gpu_qwen35.py
"""

import numpy as np
import pytest

from gpu_harness import FIXTURE_TYPES, PROMPT, reference_greedy

from reflex_runtime.families.qwen35 import delta_net
from reflex_runtime.families.qwen35.reference import sigmoid, softplus
from reflex_runtime.gpu.ops import delta_net as dn_ops
from reflex_runtime.gpu.ops import gated

pytestmark = pytest.mark.gpu

EPS = 1e-6


def silu(x):
    return x / (1 + np.exp(-x))


def gated_norm(o, z, w, eps=EPS):
    o64 = o.astype(np.float64)
    return o64 / np.sqrt((o64 * o64).mean(-1, keepdims=True) + eps) * w * silu(z.astype(np.float64))


def starts_of(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def positions(lengths, first_pos):
    """Per token its position: sequence s starts at first_pos[s] (0: a new request, fresh state)."""
    return np.concatenate([np.arange(n) + p for n, p in zip(lengths, first_pos)]).astype(np.int32)


class Layer:
    """Random inputs of one DeltaNet layer: qkv channels [q | k | v], gates, decay parameters."""

    def __init__(self, rng, n_tok, nk, nv, dk, dv, k_taps=4):
        self.nk, self.nv, self.dk, self.dv, self.k = nk, nv, dk, dv, k_taps
        self.C = 2 * nk * dk + nv * dv
        f = np.float32
        self.x = rng.standard_normal((n_tok, self.C)).astype(f)
        self.w = (rng.standard_normal((self.C, k_taps)) * 0.5).astype(f)
        self.alpha = rng.standard_normal((n_tok, nv)).astype(f)
        self.beta = rng.standard_normal((n_tok, nv)).astype(f)
        self.z = rng.standard_normal((n_tok, nv * dv)).astype(f)
        self.a = (-0.1 * np.exp(rng.standard_normal(nv) * 0.5)).astype(f)  # decays that reach across chunks
        self.dt_bias = (rng.standard_normal(nv) * 0.5).astype(f)
        self.norm_w = (rng.random(dv) + 0.5).astype(f)

    def mixed(self, conv_out):
        """Split conv outputs into per-value-head q, k (normalized, tiled) and v, as the reference does."""
        n, nk, nv, dk, dv = conv_out.shape[0], self.nk, self.nv, self.dk, self.dv
        q = conv_out[:, :nk * dk].reshape(n, nk, dk)
        k = conv_out[:, nk * dk:2 * nk * dk].reshape(n, nk, dk)
        v = conv_out[:, 2 * nk * dk:].reshape(n, nv, dv)
        return np.tile(q, (1, nv // nk, 1)), np.tile(k, (1, nv // nk, 1)), v

    def gates(self, lo, hi):
        g = self.a * softplus(self.alpha[lo:hi] + self.dt_bias)
        return g.astype(np.float32), sigmoid(self.beta[lo:hi]).astype(np.float32)


def conv_reference(layer, lengths, first_pos, states):
    """Per sequence: causal conv from its state (zeros when fresh), SiLU, q/k L2 norm; new states."""
    out, new_states, lo = [], [], 0
    nk, dk = layer.nk, layer.dk
    for n, p, st in zip(lengths, first_pos, states):
        st = np.zeros_like(st) if p == 0 else st
        o, ns = delta_net.causal_conv1d(layer.x[lo:lo + n], st, layer.w)
        o = silu(o).astype(np.float32)
        q = delta_net.l2norm(o[:, :nk * dk].reshape(n, nk, dk), EPS) * np.float32(1 / np.sqrt(dk))
        k = delta_net.l2norm(o[:, nk * dk:2 * nk * dk].reshape(n, nk, dk), EPS)
        o[:, :nk * dk], o[:, nk * dk:2 * nk * dk] = q.reshape(n, -1), k.reshape(n, -1)
        out.append(o)
        new_states.append(ns)
        lo += n
    return np.concatenate(out), np.stack(new_states)


def qkv_input(rng, layer, n_tok):
    """A plausible conv output: q, k L2-normalized per head (q scaled), v any."""
    x = rng.standard_normal((n_tok, layer.C)).astype(np.float32)
    nk, dk = layer.nk, layer.dk
    q = delta_net.l2norm(x[:, :nk * dk].reshape(n_tok, nk, dk), EPS) / np.float32(np.sqrt(dk))
    k = delta_net.l2norm(x[:, nk * dk:2 * nk * dk].reshape(n_tok, nk, dk), EPS)
    x[:, :nk * dk], x[:, nk * dk:2 * nk * dk] = q.reshape(n_tok, -1), k.reshape(n_tok, -1)
    return x


def rule_reference(layer, qkv, lengths, first_pos, states, form):
    """Per sequence the delta rule (form: delta_net.delta_rule_recurrent or _chunked) from its
    state (zeros when fresh): unnormalized o (n, nv, dv) and the final states."""
    q, k, v = layer.mixed(qkv)
    outs, finals, lo = [], [], 0
    for n, p, st in zip(lengths, first_pos, states):
        g, b = layer.gates(lo, lo + n)
        st = np.zeros_like(st) if p == 0 else st
        o, s = form(q[lo:lo + n], k[lo:lo + n], v[lo:lo + n], g, b, st)
        outs.append(o)
        finals.append(s)
        lo += n
    return np.concatenate(outs), np.stack(finals)


def poisoned_states(rng, shape, first_pos):
    """Random states; a fresh sequence's (position 0) are NaN: the kernels must not read them."""
    st = rng.standard_normal(shape).astype(np.float32) * 0.3
    for s, p in enumerate(first_pos):
        if p == 0:
            st[s] = np.nan
    return st


def slotted_states(states, slotted):
    """The states as the kernels see them: with `slotted`, sequence s's state sits in slot slots[s]
    of a buffer of two more slots than sequences (in reverse order, as continuous batching gives
    each running sequence its own slot); the spare slots 0 and 1 hold a sentinel no kernel may
    touch. (buffer, slots or None)."""
    if not slotted:
        return states, None
    n = states.shape[0]
    slots = np.arange(n + 1, 1, -1).astype(np.int32)
    buf = np.full((n + 2,) + states.shape[1:], 7.0, np.float32)
    buf[slots] = states
    return buf, slots


def check_slots(got, slots, want, **tol):
    """got: the state buffer after the kernels; want: each sequence's expected state."""
    if slots is None:
        np.testing.assert_allclose(got, want, **tol)
        return
    np.testing.assert_allclose(got[slots], want, **tol)
    assert (got[:2] == 7.0).all(), "a kernel wrote a slot no sequence owns"


def seq_args(gpu, lengths, first_pos):
    """(seq_start device pointer or 0 for one sequence, n_seq, positions pointer)."""
    seq = gpu.put(starts_of(lengths)) if len(lengths) > 1 else 0
    return seq, len(lengths), gpu.put(positions(lengths, first_pos))


SHAPES = [  # nk, nv, dk, dv: tiny, odd sizes, the converter's tiled value heads, the real head size
    (1, 1, 16, 16), (2, 6, 40, 24), (3, 3, 72, 100), (2, 4, 128, 128),
]
BATCHES = [  # sequence lengths and the position of each one's first token
    ([1], [5]), ([1, 1, 1], [0, 9, 3]), ([7], [0]), ([33, 1, 70], [12, 0, 4]), ([100], [0]), ([3, 64, 31, 32], [2, 1, 0, 7]),
]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("lengths,first_pos", BATCHES, ids=str)
@pytest.mark.parametrize("k_taps", [4, 2])
@pytest.mark.parametrize("slotted", [False, True], ids=["", "slots"])
def test_conv_silu_l2norm_and_state(gpu, shape, lengths, first_pos, k_taps, slotted):
    nk, nv, dk, dv = shape
    n = sum(lengths)
    rng = np.random.default_rng([n, nk, nv, dk, dv, k_taps, len(lengths)])
    layer = Layer(rng, n, nk, nv, dk, dv, k_taps)
    states = poisoned_states(rng, (len(lengths), k_taps - 1, layer.C), first_pos)
    want, want_states = conv_reference(layer, lengths, first_pos, np.nan_to_num(states))
    seq, n_seq, pos = seq_args(gpu, lengths, first_pos)
    buf, slots = slotted_states(states, slotted)
    st, out, sl = gpu.put(buf), gpu.poisoned((n, layer.C)), gpu.put(slots) if slotted else 0
    roll = n == n_seq  # decode-like: the conv kernel rolls the state itself
    L = gpu.launch
    dn_ops.conv(L, gpu.put(layer.x), gpu.put(layer.w), st, (k_taps - 1) * layer.C, sl, seq, n_seq, pos, out, n,
                k_taps, nk, nv, dk, dv, 1 / np.sqrt(dk), EPS, roll)
    if not roll:
        dn_ops.conv_state(L, gpu.put(layer.x), st, (k_taps - 1) * layer.C, sl, seq, n_seq, pos, n, layer.C, k_taps)
    np.testing.assert_allclose(gpu.get(out, (n, layer.C)), want, rtol=2e-5, atol=2e-6)
    check_slots(gpu.get(st, buf.shape), slots, want_states, rtol=0, atol=0)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("lengths,first_pos", BATCHES, ids=str)
@pytest.mark.parametrize("slotted", [False, True], ids=["", "slots"])
def test_delta_rule_recurrent_with_gated_norm(gpu, shape, lengths, first_pos, slotted):
    nk, nv, dk, dv = shape
    n = sum(lengths)
    rng = np.random.default_rng([n, nk, nv, dk, dv, 1])
    layer = Layer(rng, n, nk, nv, dk, dv)
    qkv = qkv_input(rng, layer, n)
    states = poisoned_states(rng, (len(lengths), nv, dk, dv), first_pos)
    o, finals = rule_reference(layer, qkv, lengths, first_pos, np.nan_to_num(states), delta_net.delta_rule_recurrent)
    want = gated_norm(o, layer.z.reshape(n, nv, dv), layer.norm_w)
    seq, n_seq, pos = seq_args(gpu, lengths, first_pos)
    buf, slots = slotted_states(states, slotted)
    st, out, sl = gpu.put(buf), gpu.poisoned((n, nv, dv)), gpu.put(slots) if slotted else 0
    dn_ops.recurrent(gpu.launch, gpu.put(qkv), gpu.put(layer.alpha), gpu.put(layer.beta), gpu.put(layer.z),
                     gpu.put(layer.a), gpu.put(layer.dt_bias), gpu.put(layer.norm_w), st, nv * dk * dv, sl, seq, n_seq,
                     pos, out, n, nk, nv, dk, dv, EPS)
    np.testing.assert_allclose(gpu.get(out, (n, nv, dv)), want, rtol=1e-4, atol=1e-4)
    check_slots(gpu.get(st, buf.shape), slots, finals, rtol=1e-4, atol=1e-5)


# more sequences than a prep + chunked pair takes (ops.delta_net.GROUP): two groups
MANY = ([5, 40, 1, 33, 2, 31, 64, 7, 3, 36, 9], [0, 3, 0, 1, 0, 0, 2, 0, 8, 0, 4])


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("lengths,first_pos", BATCHES + [MANY], ids=str)
@pytest.mark.parametrize("slotted", [False, True], ids=["", "slots"])
def test_delta_rule_chunked_matches_both_reference_forms(gpu, shape, lengths, first_pos, slotted):
    """Chunks of 32 tokens on the GPU (64 in the reference): across every chunk boundary the
    output and final state equal the reference's chunked form and its token-by-token form; every
    chunk's state-free part comes from reflex_dn_prep through NaN-poisoned scratch."""
    nk, nv, dk, dv = shape
    n = sum(lengths)
    rng = np.random.default_rng([n, nk, nv, dk, dv, 2])
    layer = Layer(rng, n, nk, nv, dk, dv)
    qkv = qkv_input(rng, layer, n)
    states = poisoned_states(rng, (len(lengths), nv, dk, dv), first_pos)
    clean = np.nan_to_num(states)
    o_chunk, s_chunk = rule_reference(layer, qkv, lengths, first_pos, clean, delta_net.delta_rule_chunked)
    o_rec, s_rec = rule_reference(layer, qkv, lengths, first_pos, clean, delta_net.delta_rule_recurrent)
    seq, n_seq, pos = seq_args(gpu, lengths, first_pos)
    buf, slots = slotted_states(states, slotted)
    st, out, sl = gpu.put(buf), gpu.poisoned((n, nv, dv)), gpu.put(slots) if slotted else 0
    scratch = gpu.poisoned((dn_ops.prep_floats(n_seq, n, nv),))
    dn_ops.chunked(gpu.launch, gpu.put(qkv), gpu.put(layer.alpha), gpu.put(layer.beta), gpu.put(layer.a),
                   gpu.put(layer.dt_bias), st, nv * dk * dv, sl, seq, n_seq, pos, out, n, nk, nv, dk, dv, scratch)
    got_o, got_s = gpu.get(out, (n, nv, dv)), gpu.get(st, buf.shape)
    for o_ref, s_ref in ((o_chunk, s_chunk), (o_rec, s_rec)):
        np.testing.assert_allclose(got_o, o_ref, rtol=1e-4, atol=1e-4)
        check_slots(got_s, slots, s_ref, rtol=1e-4, atol=1e-4)
    # the gated norm that follows the chunked form, in place
    z, w = gpu.put(layer.z), gpu.put(layer.norm_w)
    dn_ops.gated_norm(gpu.launch, out, z, w, out, n * nv, dv, EPS)
    np.testing.assert_allclose(gpu.get(out, (n, nv, dv)), gated_norm(o_rec, layer.z.reshape(n, nv, dv), layer.norm_w),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("split", [1, 31, 32, 45])
def test_prompt_in_two_passes_equals_one_and_decode_continues_it(gpu, split, nk=2, nv=4, dk=128, dv=128):
    """A prompt of 77 tokens as one chunked pass, or as two passes (the second continuing the
    state: its first position is not 0), then a token-by-token decode of 5 more: the same
    outputs and state as the reference over all 82 tokens."""
    n, n_dec = 77, 5
    rng = np.random.default_rng([split, 3])
    layer = Layer(rng, n + n_dec, nk, nv, dk, dv)
    qkv = qkv_input(rng, layer, n + n_dec)
    q, k, v = layer.mixed(qkv)
    g, b = layer.gates(0, n + n_dec)
    want_o, want_s = delta_net.delta_rule_recurrent(q, k, v, g, b, np.zeros((nv, dk, dv), np.float32))
    L, size = gpu.launch, nv * dk * dv
    st = gpu.put(np.full((nv, dk, dv), np.nan, np.float32))  # stale: the first pass starts at position 0
    out = gpu.poisoned((n + n_dec, nv, dv))
    d_qkv, d_al, d_be = gpu.put(qkv), gpu.put(layer.alpha), gpu.put(layer.beta)
    d_a, d_dt, d_pos = gpu.put(layer.a), gpu.put(layer.dt_bias), gpu.put(np.arange(n + n_dec, dtype=np.int32))
    d_z, d_w = gpu.put(layer.z), gpu.put(layer.norm_w)
    for lo, hi in ((0, split), (split, n)):
        scratch = gpu.poisoned((dn_ops.prep_floats(1, hi - lo, nv),))
        dn_ops.chunked(L, d_qkv + 4 * lo * layer.C, d_al + 4 * lo * nv, d_be + 4 * lo * nv, d_a, d_dt, st, size, 0, 0,
                       1, d_pos + 4 * lo, out + 4 * lo * nv * dv, hi - lo, nk, nv, dk, dv, scratch)
    np.testing.assert_allclose(gpu.get(out, (n, nv, dv)), want_o[:n], rtol=1e-4, atol=1e-4)
    for t in range(n, n + n_dec):
        dn_ops.recurrent(L, d_qkv + 4 * t * layer.C, d_al + 4 * t * nv, d_be + 4 * t * nv, d_z + 4 * t * nv * dv,
                         d_a, d_dt, d_w, st, size, 0, 0, 1, d_pos + 4 * t, out + 4 * t * nv * dv, 1, nk, nv, dk,
                         dv, EPS)
    want_dec = gated_norm(want_o[n:], layer.z[n:].reshape(n_dec, nv, dv), layer.norm_w)
    np.testing.assert_allclose(gpu.get(out, (n + n_dec, nv, dv))[n:], want_dec, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gpu.get(st, (nv, dk, dv)), want_s, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n_tok,n_head,hd", [(1, 1, 64), (3, 5, 96), (17, 16, 256)])
def test_gate_split_and_sigmoid_gate(gpu, n_tok, n_head, hd):
    rng = np.random.default_rng([n_tok, n_head, hd])
    qg = rng.standard_normal((n_tok, n_head, 2 * hd)).astype(np.float32)
    q, gate = gpu.poisoned((n_tok, n_head, hd)), gpu.poisoned((n_tok, n_head, hd))
    n = n_tok * n_head * hd
    gated.gate_split(gpu.launch, gpu.put(qg), q, gate, n, hd)
    np.testing.assert_array_equal(gpu.get(q, (n_tok, n_head, hd)), qg[:, :, :hd])
    np.testing.assert_array_equal(gpu.get(gate, (n_tok, n_head, hd)), qg[:, :, hd:])
    att = rng.standard_normal((n_tok, n_head, hd)).astype(np.float32)
    y = gpu.put(att)
    gated.sigmoid_mul(gpu.launch, y, gate, n)  # elementwise: the attention output gate
    np.testing.assert_allclose(gpu.get(y, att.shape), att * sigmoid(qg[:, :, hd:]), rtol=1e-6, atol=1e-7)
    rows = rng.standard_normal((n_tok, n_head * hd)).astype(np.float32)
    logit = rng.standard_normal(n_tok).astype(np.float32)
    y = gpu.put(rows)
    gated.sigmoid_mul(gpu.launch, y, gpu.put(logit), n, n_head * hd)  # per row: the shared-expert gate
    np.testing.assert_allclose(gpu.get(y, rows.shape), rows * sigmoid(logit)[:, None], rtol=1e-6, atol=1e-7)


# -- the engine against the reference ---------------------------------------------------------

def fixture(arch, outtype):
    from fixtures import make_fixture

    return str(make_fixture(arch, outtype).gguf)


def engine_for(path):
    from reflex_runtime.loader import load_engine

    return load_engine(path, "cuda")


@pytest.fixture(scope="module", params=["qwen35", "qwen35moe"])
def q8(request):
    from reflex_runtime.families import load_reference

    eng = engine_for(fixture(request.param, "q8_0"))
    return eng, load_reference(eng.gguf, eng.config)


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe"])
@pytest.mark.parametrize("outtype", FIXTURE_TYPES)
def test_check_passes(arch, outtype):
    from reflex_runtime.commands.check import run_check
    from reflex_runtime.families import load_reference

    eng = engine_for(fixture(arch, outtype))
    assert eng.runner.name == "cuda"
    res = run_check(eng, load_reference(eng.gguf, eng.config), PROMPT, 8)
    print(arch, res["weight_type"], res["max_rel_err_prompt"], res["max_rel_err_decode"])
    assert res["result"] == "PASS", {k: v for k, v in res.items() if "tokens" not in k}


@pytest.mark.parametrize("outtype", ["q8_0", "q4_0"])
def test_shared_expert_rides_with_the_routed_experts(outtype):
    """The shared expert as large as a routed one (as in Qwen3.5-35B-A3B): at decode it is one more
    slot of the routed gate/up and down launches, no launches of its own; reflex check passes."""
    from fixtures import make_fixture
    from reflex_runtime.commands.check import run_check
    from reflex_runtime.families import load_reference

    eng = engine_for(str(make_fixture("qwen35moe", outtype, 0, shared_expert_intermediate_size=256).gguf))
    res = run_check(eng, load_reference(eng.gguf, eng.config), PROMPT, 8)
    assert res["result"] == "PASS", {k: v for k, v in res.items() if "tokens" not in k}
    m = eng.runner.model
    with m.launch.record() as rec:
        m.forward(1)  # the last decode step again, eagerly
    m.launch.dev.sync(m.launch.stream)
    glu = [ln for ln in rec if ln.role == "moe experts gate/up + act"]
    k = max(eng.config.extra["n_expert_used"])
    assert glu and all(ln.grid[1] == k + 1 for ln in glu), [ln.grid for ln in glu]
    assert not [ln.role for ln in rec if ln.role.startswith("shared expert")]


def test_long_prompt_crosses_batches_and_chunks(q8):
    """> 512 tokens: two prefill passes (the second continuing the recurrent state), each
    through the chunked delta rule and the tensor-core projections."""
    from reflex_runtime.commands.check import run_check

    eng, ref = q8
    res = run_check(eng, ref, " ".join(["Once upon a time there was a small village by the sea, and"] * 55), 4)
    assert res["prompt_tokens"] > 512
    assert res["result"] == "PASS", {k: v for k, v in res.items() if "tokens" not in k}


def test_greedy_generate_equals_reference_for_32_tokens(q8):
    from reflex_runtime.sampling import SamplingParams

    eng, ref = q8
    ids = eng.prompt_ids(PROMPT)
    expect = reference_greedy(ref, ids, 32)
    assert list(eng.runner.generate_ids(ids, SamplingParams(), 32, frozenset())) == expect
    # again: the decode graph replayed, the state restarted by the new prompt's position 0
    assert list(eng.runner.generate_ids(ids, SamplingParams(), 32, frozenset())) == expect


def test_system1_scores_equal_reference_in_one_batched_pass(q8):
    from reflex_runtime.reference.runner import ReferenceRunner

    eng, ref_model = q8
    ref = ReferenceRunner(ref_model)
    cands = [" Paris", " London", " Berlin", " the city of lights, of art, of fashion and of many more things", " Paris"]
    before = eng.runner.forward_passes
    res = eng.system1(prompt="The capital of France is", candidates=cands)
    # one pass for the prompt, one for every candidate together (forked recurrent state)
    assert eng.runner.forward_passes == before + 2
    ids = eng.prompt_ids("The capital of France is")
    expect = ref.score(ids, [c["token_ids"] for c in res["candidates"]])
    assert max(len(c["token_ids"]) for c in res["candidates"]) > 1 + 8  # one candidate takes the chunked path
    for c, lp in zip(res["candidates"], expect):
        np.testing.assert_allclose(c["token_logprobs"], lp, rtol=2e-3, atol=2e-3)
    assert res["candidates"][0]["score"] == res["candidates"][4]["score"]
    # short candidates only: the delta rule token by token
    short = eng.system1(prompt="The capital of France is", candidates=[" Paris", " Lyon is", " Nice"])
    assert eng.runner.forward_passes == before + 4
    expect = ref.score(ids, [c["token_ids"] for c in short["candidates"]])
    for c, lp in zip(short["candidates"], expect):
        np.testing.assert_allclose(c["token_logprobs"], lp, rtol=2e-3, atol=2e-3)
    # scoring left the engine able to generate (state restarts at position 0)
    from reflex_runtime.sampling import SamplingParams

    gen_ids = eng.prompt_ids(PROMPT)
    assert list(eng.runner.generate_ids(gen_ids, SamplingParams(), 8, frozenset())) == reference_greedy(ref_model,
                                                                                                         gen_ids, 8)


def test_backend_auto_runs_on_the_gpu():
    from reflex_runtime.loader import load_engine

    eng = load_engine(fixture("qwen35moe", "q4_k_m"), "auto")
    assert eng.runner.name == "cuda"
