"""Continuous batching on the CUDA runner (gpu/batch.py): the decode attention over a batch of
sequences (one row each, each in its own cache range), reflex_pick_rows, and whole sequences
decoded together against each one alone and against the numpy reference.

Run on a GPU machine: pytest -m gpu tests/test_gpu_batch.py
"""

import numpy as np
import pytest
from teacher_forced import compare
from gpu_harness import TYPE_NAMES
from gpu_harness import random_weight as weight
from test_gpu_kernels import TC_RTOL, _attention_ref, _gemm_ks, _sm80, assert_matmul_close
from test_gpu_kernels import knobs  # noqa: F401 (the fixture)

from reflex_runtime.gpu.ops import attention, attn_decode, gemm
from reflex_runtime.gpu.ops import sample as sample_ops
from reflex_runtime.gpu.ops.sample import RxRows, RxSampling

pytestmark = pytest.mark.gpu

ROW_CASES = {
    # name: (n_head, n_kv_heads, hd, lengths of the rows' sequences, window)
    "qwen3_rows5": (16, 8, 128, (1, 37, 300, 2, 129), 0),
    "gqa4_rows3_long": (8, 2, 128, (1500, 65, 7), 0),
    "gemma_window_rows4": (4, 1, 256, (700, 3, 40, 513), 512),
    "hd96_rows2": (6, 3, 96, (50, 51), 0),
    # a short row after a long one: the scalar kernel's rows take fewer slices than the launch's
    # and must still keep to their own partials
    "short_after_long": (16, 8, 128, (300, 3, 200, 1, 17), 0),
    "short_rows": (16, 8, 128, (1, 64, 5, 33), 0),  # every row in one or two tiles
}


def _rows_problem(case):
    n_head, n_kvh, hd, lens, window = ROW_CASES[case]
    rng = np.random.default_rng(list(case.encode()))
    C = max(lens) + 13  # each sequence's range of the cache
    R = len(lens)
    n_ctx = R * C + 5
    kc = rng.standard_normal((n_kvh, n_ctx, hd)).astype(np.float16)
    vc = rng.standard_normal((n_kvh, n_ctx, hd)).astype(np.float16)
    kv_pos = (np.arange(n_ctx, dtype=np.int32) % C) + 2  # slot r*C + j holds position j + 2
    q = (rng.standard_normal((R, n_head, hd)) * 2).astype(np.float32)
    seq_lo = (np.arange(R) * C).astype(np.int32)
    q_slot = (seq_lo + np.array(lens) - 1).astype(np.int32)
    q_pos = kv_pos[q_slot]
    scale = 1.0 / np.sqrt(hd)
    expect = np.concatenate([_attention_ref(q[r:r + 1], kc, vc, kv_pos, q_pos[r:r + 1], q_slot[r:r + 1],
                                            seq_lo[r:r + 1], 0, n_ctx, window, scale, 0.0) for r in range(R)])
    return (n_head, n_kvh, hd, window, R, n_ctx, scale), (q, kc, vc, kv_pos, q_pos, q_slot, seq_lo), expect


@pytest.mark.parametrize("case", list(ROW_CASES))
@pytest.mark.parametrize("prefetch,head_groups", [(False, 1), (True, 1), (True, 2)])
def test_decode_attention_rows(gpu, knobs, case, prefetch, head_groups):
    """Row r sees its own range only (keys seq_lo[r] .. its slot), whatever the other rows hold
    (head_groups 2: each row's counters are n_head_kv * 2 of its n_head)."""
    (n_head, n_kvh, hd, window, R, n_ctx, scale), arrays, expect = _rows_problem(case)
    q, kc, vc, kv_pos, q_pos, q_slot, seq_lo = (gpu.put(a) for a in arrays)
    knobs.attn_min_keys = 16
    knobs.attn_head_groups = head_groups
    part_o = gpu.poisoned((R * n_head * attn_decode.SPLITS_MAX * hd,))
    part_ml = gpu.poisoned((R * n_head * attn_decode.SPLITS_MAX * 2,))
    counters = gpu.put(np.zeros(attn_decode.counters(n_head, R), np.int32))
    for window_slots in [False, window > 0]:
        out = gpu.poisoned((R, n_head, hd))
        assert attn_decode.attention(gpu.launch, q, kc, vc, kv_pos, q_pos, q_slot, gpu.put(np.array([n_ctx], np.int32)),
                                     out, part_o, part_ml, counters, n_head, n_kvh, hd, hd, n_ctx, window, scale, 0.0,
                                     prefetch, window_slots, rows=R, seq_lo=seq_lo)
        np.testing.assert_allclose(gpu.get(out, (R, n_head, hd)), expect, rtol=2e-4, atol=2e-4)
    assert not gpu.get(counters, (attn_decode.counters(n_head, R),), np.int32).any()


def test_decode_attention_rows_one_slice_each(gpu, knobs):
    """A big batch's grid may give each row one slice: the first head group then takes every query
    head (the plan's head groups need room among the slices)."""
    knobs.attn_blocks_per_sm = 0.25
    assert attn_decode.splits(gpu.launch, 8 * 4) == 1  # short_rows: 8 KV heads, 4 rows
    test_decode_attention_rows(gpu, knobs, "short_rows", True, 2)


@pytest.mark.parametrize("case", ["qwen3_rows5", "hd96_rows2", "short_after_long"])
def test_scalar_attention_rows_start_at_their_range(gpu, case):
    """The legacy kernel (GPUs or head sizes the decode kernel does not serve) on the same rows."""
    (n_head, n_kvh, hd, window, R, n_ctx, scale), arrays, expect = _rows_problem(case)
    q, kc, vc, kv_pos, q_pos, q_slot, seq_lo = (gpu.put(a) for a in arrays)
    out = gpu.poisoned((R, n_head, hd))
    part_o = gpu.poisoned((R * n_head * attention.SPLITS_DECODE * hd,))
    part_ml = gpu.poisoned((R * n_head * attention.SPLITS_DECODE * 2,))
    counters = gpu.put(np.zeros(R * n_head, np.int32))
    attention.attention(gpu.launch, q, kc, vc, kv_pos, q_pos, q_slot, seq_lo, 0, gpu.put(np.array([n_ctx], np.int32)),
                        out, part_o, part_ml, counters, R, n_head, n_kvh, hd, hd, n_ctx, window, scale, 0.0,
                        attention.SPLITS_DECODE)
    np.testing.assert_allclose(gpu.get(out, (R, n_head, hd)), expect, rtol=2e-4, atol=2e-4)


def test_pick_rows_greedy_and_sampled_per_row(gpu):
    """Each row picks with its own settings and its own step (the request's token index)."""
    from reflex_runtime.reference.sampling import sample
    from reflex_runtime.sampling import SamplingParams

    vocab = 1003  # not a multiple of anything the kernel strides by
    rng = np.random.default_rng(11)
    settings = [dict(), dict(temperature=0.7, top_k=1), dict(temperature=0.8), dict(temperature=1.0, top_k=40),
                dict(temperature=1.3, top_p=0.9), dict(temperature=0.9, min_p=0.05), dict()]
    R = len(settings)
    logits = (rng.standard_normal((R, vocab)) * 3).astype(np.float32)
    logits[0, [5, 900]] = logits[0].max() + 1  # a tie: the lower id
    logits[6, 17] = np.nan  # NaN never wins
    params = [SamplingParams(seed=int(rng.integers(0, 2**63)), **s) for s in settings]
    sp = b"".join(bytes(RxSampling(p.temperature, p.top_k, p.top_p, p.min_p, p.seed)) for p in params)
    steps = rng.integers(0, 50, R).astype(np.int32)
    pos = rng.integers(0, 1000, R).astype(np.int32)
    slot = pos + 4096 * np.arange(R, dtype=np.int32)
    bufs = {k: gpu.put(v) for k, v in dict(tokens=np.full(R, -1, np.int32), pos=pos, slot=slot, steps=steps).items()}
    sample_ops.pick_rows(gpu.launch, gpu.put(logits), vocab, gpu.put(np.frombuffer(sp, np.uint8)),
                         RxRows(bufs["tokens"], bufs["pos"], bufs["slot"], bufs["steps"]), R)
    got = gpu.get(bufs["tokens"], (R,), np.int32)
    expect = [sample(np.nan_to_num(logits[r], nan=-np.inf), params[r], int(steps[r])) for r in range(R)]
    assert list(got) == expect
    assert got[0] == 5
    np.testing.assert_array_equal(gpu.get(bufs["pos"], (R,), np.int32), pos + 1)
    np.testing.assert_array_equal(gpu.get(bufs["slot"], (R,), np.int32), slot + 1)
    np.testing.assert_array_equal(gpu.get(bufs["steps"], (R,), np.int32), steps + 1)


@pytest.mark.parametrize("qtype", list(TYPE_NAMES), ids=lambda t: t.name)
def test_gemm_split_k_in_a_decode_batch(gpu, qtype):
    """An accumulated product of a decode batch whose tiles do not fill the GPU splits K across
    blocks that add into the output: the same sums as numpy, for every type, K at awkward sizes."""
    _sm80(gpu)
    L = gpu.launch
    for k in _gemm_ks(qtype) + [3072]:
        rng = np.random.default_rng([int(qtype), k])
        w, dense = weight(gpu, qtype, 200, k, rng)
        for n_tok in (4, 37, 64):
            assert gemm.k_splits(L, w, 4, True) == (1, 0)  # a prompt splits only with a scratch (none here)
            L.decode_rows = True
            try:
                z, part = gemm.k_splits(L, w, 4, True)
                assert (z > 1 or k <= gemm.stage_weights(w.type_name)) and part == 0  # atomically
                x = rng.standard_normal((n_tok, k)).astype(np.float32)
                base = rng.standard_normal((n_tok, w.rows)).astype(np.float32)
                y = gpu.put(base)
                gemm.gemm(L, [w], gpu.put(x), [y], n_tok, accumulate=True, cfg="s")
            finally:
                L.decode_rows = False
            assert_matmul_close(gpu.get(y, (n_tok, w.rows)), x, dense, base, rtol=TC_RTOL)


# -- whole sequences ------------------------------------------------------------------------------

PROMPTS = ["The capital of France is the city of", "Once upon a time", "1 2 3 4 5 6 7 8 9 10 11 12 13 14",
           "a"]
NEW = 24


def _engine(arch, outtype, parallel=4, kv_tokens=None, max_context=None):
    from fixtures import make_fixture

    from reflex_runtime.families import load_reference
    from reflex_runtime.loader import load_engine

    overrides = {}
    if arch.startswith("deepseek_"):  # the GPU tests' DeepSeek configurations
        from fixtures.deepseek import GPU_CONFIGS

        arch, overrides = GPU_CONFIGS[arch.removeprefix("deepseek_")]
    eng = load_engine(str(make_fixture(arch, outtype, **overrides).gguf), "cuda", max_seqs=parallel,
                      kv_tokens=kv_tokens, max_context=max_context)
    return eng, load_reference(eng.gguf, eng.config)


def _run(runner, prompts, params, join_after=None, chunk=5, between=None, scoring=None):
    """Drive the batch API as the scheduler does: prompts in chunks of `chunk` tokens beside the
    running decodes; with join_after, the last prompt joins once the others have that many tokens;
    with scoring = (prompt, candidates, results), a system1 request in every step, scores appended
    to results."""
    from reflex_runtime.gpu.step import Pick

    out = {}
    todo = list(range(len(prompts)))
    late = todo.pop() if join_after is not None else None
    sids, fed = {}, {}

    def open_(i):
        sids[i] = runner.batch_open(prompts[i], Pick(params[i]), NEW, frozenset())
        fed[i] = 0
        out[i] = []

    for i in todo:
        open_(i)
    sizes = []
    while any(len(out[i]) < NEW for i in out) or (late is not None and late not in out):
        if late is not None and late not in out and min(len(out[i]) for i in todo) >= join_after:
            open_(late)
        prefill = [(sids[i], min(chunk, len(prompts[i]) - fed[i])) for i in out if fed[i] < len(prompts[i])]
        for sid, n in prefill:
            fed[next(i for i in sids if sids[i] == sid)] += n
        decode = [sids[i] for i in out if fed[i] >= len(prompts[i]) and out[i] and len(out[i]) < NEW]
        sizes.append(len(decode))
        if scoring is not None:
            s1 = runner.batch_open_score(scoring[0], scoring[1])
            got = runner.batch_step(prefill, decode, score=[s1])
            scoring[2].append(got.pop(s1))
            runner.batch_close(s1)
        else:
            got = runner.batch_step(prefill, decode)
        if between is not None:
            between()
        for i, sid in sids.items():
            out[i] += got.get(sid, [])
            if len(out[i]) >= NEW and sid is not None:
                runner.batch_close(sid)
                sids[i] = None
    return out, sizes


@pytest.mark.parametrize("arch,outtype", [("qwen3", "q8_0"), ("qwen3", "q4_k_m"), ("gemma3", "q4_k_m"),
                                          ("llama", "f32"), ("qwen3moe", "q8_0"), ("qwen35", "q8_0"),
                                          ("qwen35moe", "q8_0"), ("deepseek_v2lite", "q8_0"),
                                          ("deepseek_v3", "q8_0"), ("deepseek_v3_wide", "q8_0")])
def test_sequences_together_match_each_alone(arch, outtype):
    """Greedy: the tokens of every sequence are the same whether it decoded alone (the batch path
    with one row: the single-sequence graph) or beside others (N-row graphs, a sequence joining
    mid-way, prompts in chunks), and alone they equal generate_ids (the CLI path; but near-ties where
    the CLI's whole prompt takes the tensor cores and the 5-token chunks do not); the reference,
    teacher-forced, agrees with every pick of both but near-ties. From 4 rows the matrix products
    run on tensor cores, whose sums round differently from the one-row kernels': where the
    reference's two best tokens are a near-tie (the random-weight fixtures have some, real models
    rarely), the two runs may part there, and only there."""
    from reflex_runtime.gpu.products import MM_MIN_TOKENS
    from reflex_runtime.sampling import SamplingParams

    eng, ref = _engine(arch, outtype)
    runner = eng.runner
    assert runner.max_seqs == 4
    prompts = [eng.tokenizer.encode(p, add_special=True) for p in PROMPTS]
    greedy = [SamplingParams()] * len(prompts)
    alone = {i: _run(runner, [p], greedy[:1])[0][0] for i, p in enumerate(prompts)}
    for i, p in enumerate(prompts):
        cli = list(runner.generate_ids(p, SamplingParams(), NEW, frozenset()))
        if len(p) < MM_MIN_TOKENS:  # _run's 5-token chunks and the CLI's one chunk: the same products
            assert cli == alone[i], i
        else:  # the CLI's one chunk on tensor cores, _run's chunks on the matrix-vector kernels
            _same_but_near_ties(ref, p, cli, alone[i])
    together, sizes = _run(runner, prompts, greedy, join_after=2)
    assert max(sizes) == 4 and 3 in sizes
    for i in alone:
        _same_but_near_ties(ref, prompts[i], together[i], alone[i])


@pytest.mark.parametrize("arch,outtype", [("qwen3", "q8_0"), ("gemma3", "q4_k_m"), ("qwen3moe", "q8_0"),
                                          ("llama", "f32")])
def test_prompts_of_one_step_share_forwards(arch, outtype):
    """Attention-only families run the prompt chunks of a step together (gpu/batch.py): 4 prompts
    of 300, 1, 250 and 77 tokens admitted in one step take two forwards of the 512 tokens one
    holds (the 250-token one split across them), each get their first token in that step, and
    then decode the tokens each gets alone, its prompt in one chunk (but near-ties: the products
    and the attention's tiles round otherwise in a packed forward; Gemma's sliding window of 8
    crosses every chunk)."""
    from reflex_runtime.gpu.step import Pick
    from reflex_runtime.sampling import SamplingParams

    eng, ref = _engine(arch, outtype)
    r = eng.runner
    assert r.model.packs_prompts and r.model.max_batch == 512
    text = eng.tokenizer.encode(" ".join(["Once upon a time there was a small village by the sea, and"] * 30))
    prompts = [text[:300], text[7:8], text[20:270], text[100:177]]
    assert [len(p) for p in prompts] == [300, 1, 250, 77]
    alone = [_run(r, [p], [SamplingParams()], chunk=len(p))[0][0] for p in prompts]
    sids = [r.batch_open(p, Pick(SamplingParams()), NEW, frozenset()) for p in prompts]
    n_fwd = r.forward_passes
    first = r.batch_step([(s, len(p)) for s, p in zip(sids, prompts)], [])
    assert r.forward_passes - n_fwd == 2 and all(len(first.get(s, ())) == 1 for s in sids), first
    got = {s: list(first[s]) for s in sids}
    while any(len(v) < NEW for v in got.values()):
        for s, toks in r.batch_step([], [s for s in sids if len(got[s]) < NEW]).items():
            got[s] += toks
    for s in sids:
        r.batch_close(s)
    for p, s, a in zip(prompts, sids, alone):
        if got[s] != a:
            _same_but_near_ties(ref, p, got[s], a)


def _same_but_near_ties(ref, prompt, got, want):
    """got == want, or they part at a step where the reference calls one of them a near-tie;
    both agree with the reference, teacher-forced, but at near-ties."""
    from reflex_runtime.sampling import SamplingParams

    vs = [compare(ref, prompt, x, SamplingParams()) for x in (want, got)]
    assert all(v.excused <= 1 for v in vs), vs
    if got != want:
        j = next(j for j, (a, b) in enumerate(zip(got, want)) if a != b)
        assert any(j in v.pick_ties for v in vs), (j, got, want)


def test_a_full_kv_pool_makes_sequences_wait_their_turn():
    """A pool (--kv-tokens) that holds two of these requests at once: the scheduler runs two, the
    others wait for their blocks, and each gets its tokens alone (the block table maps every
    range to blocks others used before)."""
    from reflex_runtime.gpu.step import Pick
    from reflex_runtime.sampling import SamplingParams

    eng, ref = _engine("qwen3", "q8_0", kv_tokens=80, max_context=64)
    r = eng.runner
    assert r.model.pool_blocks[1] == 5
    prompts = [eng.tokenizer.encode(p, add_special=True) for p in PROMPTS]
    alone = [list(r.generate_ids(p, SamplingParams(), NEW, frozenset())) for p in prompts]
    sched = eng.start_scheduler(4)
    try:
        tickets = [sched.submit(p, Pick(SamplingParams()), NEW, frozenset()) for p in prompts]
        got = [list(t) for t in tickets]
    finally:
        eng.stop_scheduler()
    for p, g, a in zip(prompts, got, alone):
        _same_but_near_ties(ref, p, g, a)
    blocks = [-(-(len(p) + NEW) // 16) for p in prompts]
    assert max(len(p) + len(d) for p, d in sched.step_log) < 4 and sum(blocks) > 5
    assert r._batch.pool.free_tokens == r._batch.pool.tokens


def test_seeded_sampling_in_a_batch_is_reproducible():
    from reflex_runtime.sampling import SamplingParams

    eng, _ = _engine("qwen3", "q8_0")
    prompts = [eng.tokenizer.encode(p, add_special=True) for p in PROMPTS]
    params = [SamplingParams(temperature=0.9, top_k=40, seed=100 + i) for i in range(len(prompts))]
    alone = {i: _run(eng.runner, [p], [params[i]])[0][0] for i, p in enumerate(prompts)}
    together, _ = _run(eng.runner, prompts, params)
    again, _ = _run(eng.runner, prompts, params, join_after=3)
    assert together == again
    assert together == alone


def test_hooked_sequence_beside_plain_ones():
    """A logprobs request decodes beside plain ones (its own one-token passes) and gets the
    logprobs the single-sequence path gives."""
    from reflex_runtime.gpu.step import Pick
    from reflex_runtime.sampling import Sampled, SamplingParams

    eng, _ = _engine("qwen3", "q8_0")
    r = eng.runner
    prompts = [eng.tokenizer.encode(p, add_special=True) for p in PROMPTS[:3]]
    single = list(r.generate_ids(prompts[0], SamplingParams(), NEW, frozenset(), logprobs=3))
    sids = [r.batch_open(prompts[0], Pick(SamplingParams(), 3), NEW, frozenset())]
    sids += [r.batch_open(p, Pick(SamplingParams()), NEW, frozenset()) for p in prompts[1:]]
    got = {s: [] for s in sids}
    first = r.batch_step([(s, len(p)) for s, p in zip(sids, prompts)], [])
    for s in sids:
        got[s] += first.get(s, [])
    while any(len(v) < NEW for v in got.values()):
        step = r.batch_step([], [s for s in sids if len(got[s]) < NEW])
        for s, toks in step.items():
            got[s] += toks
    for s in sids:
        r.batch_close(s)
    hooked = got[sids[0]]
    assert all(isinstance(t, Sampled) for t in hooked)
    assert [t.token_id for t in hooked] == [t.token_id for t in single]
    for a, b in zip(hooked, single):
        assert abs(a.logprob - b.logprob) < 1e-4 and a.top_ids == b.top_ids


@pytest.mark.parametrize("arch", ["qwen3", "qwen35", "deepseek_v2lite", "gemma3"])
def test_system1_in_a_step_and_between_steps_leaves_the_batch_alone(arch):
    """A system1 request in every step (the scheduler's way: a sequence of one step in its own
    paged range, its tree after the decode rows; Qwen3.5 forks its range's state) and one
    between steps (runner.score, the runner's own range): the decoding sequences' tokens are those
    of a batch without them, and the scores those of an idle runner."""
    from reflex_runtime.sampling import SamplingParams

    eng, _ = _engine(arch, "q8_0")
    r = eng.runner
    prompts = [eng.tokenizer.encode(p, add_special=True) for p in PROMPTS[:3]]
    greedy = [SamplingParams()] * len(prompts)
    cands = [[5, 6], [7], [8, 9, 10]]
    expect = r.score(prompts[1], cands)
    plain, _ = _run(r, prompts, greedy)
    in_steps, between = [], []
    mixed, _ = _run(r, prompts, greedy, scoring=(prompts[1], cands, in_steps))
    assert mixed == plain
    mixed, _ = _run(r, prompts, greedy, between=lambda: between.append(r.score(prompts[1], cands)))
    assert mixed == plain
    assert len(in_steps) > 10 and len(between) > 10
    for got in in_steps + between:
        for g, e in zip(got, expect):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
    assert r._batch.pool.free_tokens == r._batch.pool.tokens  # every scoring's blocks came back


@pytest.mark.parametrize("arch", ["qwen3", "qwen35"])
def test_system1_beyond_one_pass_matches_the_reference(arch):
    """Prompt + candidates over one forward pass (512 tokens): the tree runs the prompt with each
    candidate in turn in chunks (fork: the prompt in chunks), and the rows that score a candidate
    may straddle two chunks (a prompt of 509 tokens); in the runner's own range and in a batch's."""
    from reflex_runtime.reference.runner import ReferenceRunner

    eng, ref_model = _engine(arch, "q8_0", max_context=1024)
    r, ref = eng.runner, ReferenceRunner(ref_model, max_context=1024)
    rng = np.random.default_rng(5)
    for n_p in (509, 600):
        prompt = [int(t) for t in rng.integers(3, 200, n_p)]
        cands = [[int(t) for t in rng.integers(3, 200, k)] for k in (6, 1, 3)]
        expect = ref.score(prompt, cands)
        s1 = r.batch_open_score(prompt, cands)
        in_batch = r.batch_step([], [], score=[s1])[s1]
        r.batch_close(s1)
        for got in (r.score(prompt, cands), in_batch):
            for g, e in zip(got, expect):
                np.testing.assert_allclose(g, e, rtol=2e-3, atol=2e-3)


