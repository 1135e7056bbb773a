"""Qwen3-MoE on the GPU: the router and expert kernels against numpy on fresh random inputs
(awkward sizes, NaN-poisoned outputs, ties in router scores), then the engine against the numpy
reference on tiny converter-made fixtures of every weight type.

Run on a GPU machine: pytest -m gpu tests/test_gpu_moe.py
"""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from gpu_harness import FIXTURE_TYPES, PROMPT, act_ref, k_for, random_weight, reference_greedy, rms_ref

from reflex_runtime.gpu.ops import gemm, moe, moe_decode, mvs, norm
from reflex_runtime.gpu.ops.moe import MoeGroups

pytestmark = pytest.mark.gpu


def _route(logits, k, normalize):
    from reflex_runtime.reference.blocks import softmax_topk as route

    return route(logits, k, normalize)


# -- router ----------------------------------------------------------------------------------

@pytest.mark.parametrize("n_expert,k", [(4, 1), (4, 2), (8, 8), (60, 5), (128, 8), (257, 3), (1024, 8)])
@pytest.mark.parametrize("normalize", [True, False])
def test_router_topk_matches_reference_with_ties(gpu, n_expert, k, normalize):
    rng = np.random.default_rng([n_expert, k, normalize])
    n_tok = 9
    logits = (rng.standard_normal((n_tok, n_expert)) * 2).astype(np.float32)
    # ties the reference breaks toward the lower expert id: a tied maximum, a tie across the
    # k-th place, every score equal, and ties between ids far apart
    logits[1, :] = logits[1, 0]
    logits[2, [n_expert - 1, 0]] = logits[2].max() + 1
    order = np.argsort(-logits[3], kind="stable")
    logits[3, order[min(k, n_expert - 1)]] = logits[3, order[k - 1]]
    logits[4, ::3] = 0.5
    ids, w = gpu.poisoned((n_tok, k), np.int32), gpu.poisoned((n_tok, k))
    moe.topk(gpu.launch, gpu.put(logits), n_tok, n_expert, k, normalize, ids, w)
    want_ids, want_w = _route(logits, k, normalize)
    got_ids = gpu.get(ids, (n_tok, k), np.int32)
    assert (got_ids == want_ids).all(), (got_ids, want_ids)
    np.testing.assert_allclose(gpu.get(w, (n_tok, k)), want_w, rtol=2e-6, atol=1e-7)


# -- experts, small batches --------------------------------------------------------------------

def _experts(gpu, qtype, n_expert, n_embd, n_ff, rng):
    """Stacked gate, up (n_expert * n_ff, n_embd) and down (n_expert * n_embd, n_ff) weights."""
    wg, dg = random_weight(gpu, qtype, n_expert * n_ff, n_embd, rng)
    wu, du = random_weight(gpu, qtype, n_expert * n_ff, n_embd, rng)
    wd, dd = random_weight(gpu, qtype, n_expert * n_embd, n_ff, rng)
    dense = (dg.reshape(n_expert, n_ff, n_embd), du.reshape(n_expert, n_ff, n_embd), dd.reshape(n_expert, n_embd, n_ff))
    return (wg, wu, wd), dense


def _ff_for(qtype, multiple_of_64):
    if qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
        return 256
    return 192 if multiple_of_64 else 96


def _bound(x, w):
    return np.abs(x).astype(np.float64) @ np.abs(w).T.astype(np.float64)


@pytest.mark.parametrize("qtype", [Q.F32, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q5_0, Q.Q4_1, Q.Q5_1, Q.Q4_K, Q.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok,n_expert,k", [(1, 8, 2), (1, 6, 6), (5, 12, 3), (3, 40, 8)])
def test_expert_matvec_glu_and_down(gpu, qtype, n_tok, n_expert, k):
    rng = np.random.default_rng([int(qtype), n_tok, n_expert, k])
    E, F = k_for(qtype, False), _ff_for(qtype, False)
    (wg, wu, wd), (dg, du, dd) = _experts(gpu, qtype, n_expert, E, F, rng)
    x = (rng.standard_normal((n_tok, E)) * 0.5).astype(np.float32)
    nw = (rng.random(E) + 0.5).astype(np.float32)
    ids, w = _route(rng.standard_normal((n_tok, n_expert)).astype(np.float32), k, True)
    ids_d, w_d = gpu.put(ids.astype(np.int32)), gpu.put(w)
    act = gpu.poisoned((n_tok * k, F))
    moe.glu_mv(gpu.launch, wg, wu, F * wg.row_bytes, ids_d, k, gpu.put(x), act, n_tok, F, 0, gpu.put(nw), 1e-6)
    got_act = gpu.get(act, (n_tok * k, F))
    xn = rms_ref(x, nw, 1e-6)
    assert not np.isnan(got_act).any(), "the kernel left poisoned outputs"
    for p in range(n_tok * k):
        t, e = p // k, ids.flat[p]
        g, u = xn[t] @ dg[e].T, xn[t] @ du[e].T
        tol = 3e-4 * _bound(xn[t:t + 1], dg[e])[0] * _bound(xn[t:t + 1], du[e])[0] + 1e-5
        assert (np.abs(got_act[p] - act_ref(g, 0) * u) <= tol).all(), (p, np.abs(got_act[p] - act_ref(g, 0) * u).max())
    # down, summed over each token's slots into the residual (the GPU's act as its input)
    base = rng.standard_normal((n_tok, E)).astype(np.float32)
    xd = gpu.put(base)
    moe.down_mv(gpu.launch, wd, E * wd.row_bytes, ids_d, w_d, k, act, xd, n_tok, E)
    expect, tol = base.astype(np.float64), np.full((n_tok, E), 1e-5)
    for p in range(n_tok * k):
        t, e = p // k, ids.flat[p]
        expect[t] += w.flat[p] * (got_act[p].astype(np.float64) @ dd[e].T)
        tol[t] += 1e-4 * w.flat[p] * _bound(got_act[p:p + 1], dd[e])[0]
    got = gpu.get(xd, (n_tok, E))
    assert (np.abs(got - expect) <= tol).all(), np.abs(got - expect).max()


# -- experts, grouped prefill -------------------------------------------------------------------

@pytest.mark.parametrize("qtype", [Q.F16, Q.Q8_0, Q.Q5_0, Q.Q4_1, Q.Q4_K, Q.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok,n_expert,k,skewed", [(70, 8, 3, False), (130, 5, 2, True), (64, 16, 8, False)])
def test_grouped_expert_prefill(gpu, qtype, n_tok, n_expert, k, skewed):
    rng = np.random.default_rng([int(qtype), n_tok, n_expert, k, skewed])
    E, F = k_for(qtype, True), _ff_for(qtype, True)
    (wg, wu, wd), (dg, du, dd) = _experts(gpu, qtype, n_expert, E, F, rng)
    logits = rng.standard_normal((n_tok, n_expert)).astype(np.float32)
    if skewed:  # every token's first choice is expert 3: one group of n_tok > 2 * 64 rows
        logits[:, 3] = 10
    ids, w = _route(logits, k, True)
    ids = ids.astype(np.int32)
    # inputs scaled so gate/up outputs are O(1): the tensor-core path rounds its inputs to f16
    # (|x| < 65504), and K-quant test blocks decode to large weights
    h = (rng.standard_normal((n_tok, E)) / (dg.std() * np.sqrt(E))).astype(np.float32)
    pairs = n_tok * k
    counts, offsets = gpu.poisoned((n_expert,), np.int32), gpu.poisoned((n_expert,), np.int32)
    pair_tok, pair_id = gpu.poisoned((pairs,), np.int32), gpu.poisoned((pairs,), np.int32)
    ids_d = gpu.put(ids)
    moe.group(gpu.launch, ids_d, pairs, n_expert, k, counts, offsets, pair_tok, pair_id)
    want_id = np.argsort(ids.reshape(-1), kind="stable")  # by expert, then pair order
    want_counts = np.bincount(ids.reshape(-1), minlength=n_expert)
    assert (gpu.get(counts, (n_expert,), np.int32) == want_counts).all()
    assert (gpu.get(offsets, (n_expert,), np.int32) == np.concatenate([[0], np.cumsum(want_counts)[:-1]])).all()
    assert (gpu.get(pair_id, (pairs,), np.int32) == want_id).all()
    assert (gpu.get(pair_tok, (pairs,), np.int32) == want_id // k).all()

    g, u = gpu.poisoned((pairs, F)), gpu.poisoned((pairs, F))
    h_d = gpu.put(h)
    for wt, out in ((wg, g), (wu, u)):
        moe.mm(gpu.launch, wt, F * wt.row_bytes, n_expert, F, counts, offsets, pair_tok, pair_id, h_d, out)
    got_g, got_u = gpu.get(g, (pairs, F)), gpu.get(u, (pairs, F))
    assert not np.isnan(got_g).any() and not np.isnan(got_u).any(), "a routed row was left unwritten"
    for p in range(pairs):
        t, e = p // k, ids.flat[p]
        for got, dense in ((got_g, dg), (got_u, du)):
            tol = 2e-3 * _bound(h[t:t + 1], dense[e])[0] + 1e-5  # f16 tensor-core inputs
            assert (np.abs(got[p] - h[t].astype(np.float64) @ dense[e].T) <= tol).all(), (p, e)
    act = gpu.poisoned((pairs, F))
    norm.glu(gpu.launch, g, u, act, pairs * F, 0)
    got_act = gpu.get(act, (pairs, F))
    y = gpu.poisoned((pairs, E))
    moe.mm(gpu.launch, wd, E * wd.row_bytes, n_expert, E, counts, offsets, pair_id, pair_id, act, y)
    base = rng.standard_normal((n_tok, E)).astype(np.float32)
    x = gpu.put(base)
    moe.combine(gpu.launch, y, gpu.put(w), k, x, E, n_tok)
    expect, tol = base.astype(np.float64), np.full((n_tok, E), 1e-4)
    for p in range(pairs):
        t, e = p // k, ids.flat[p]
        expect[t] += w.flat[p] * (got_act[p].astype(np.float64) @ dd[e].T)
        tol[t] += 2e-3 * w.flat[p] * _bound(got_act[p:p + 1], dd[e])[0]
    got = gpu.get(x, (n_tok, E))
    assert (np.abs(got - expect) <= tol).all(), np.abs(got - expect).max()


# -- the engine on tiny Qwen3-MoE fixtures ------------------------------------------------------

def _engine(outtype):
    from fixtures import make_fixture

    from reflex_runtime.loader import load_engine
    from reflex_runtime.families import load_reference

    eng = load_engine(str(make_fixture("qwen3moe", outtype).gguf), "cuda")
    return eng, load_reference(eng.gguf, eng.config)


@pytest.mark.parametrize("outtype", FIXTURE_TYPES)
def test_check_passes_qwen3moe(outtype):
    from reflex_runtime.commands.check import run_check

    eng, ref = _engine(outtype)
    assert eng.runner.name == "cuda"
    res = run_check(eng, ref, PROMPT, 8)
    print(res["weight_type"], res["max_rel_err_prompt"], res["max_rel_err_decode"])
    assert res["result"] == "PASS", {k: v for k, v in res.items() if "tokens" not in k}


def test_qwen3moe_long_prompt_grouped_prefill_and_greedy_32():
    """A > 512-token prompt runs the grouped (tensor-core) expert path in two chunks; then 32
    greedy tokens from the decode graph (routing on the GPU) equal the reference's."""
    from reflex_runtime.commands.check import run_check
    from reflex_runtime.sampling import SamplingParams

    eng, ref = _engine("q8_0")
    long_prompt = " ".join(["Once upon a time there was a small village by the sea, and"] * 55)
    res = run_check(eng, ref, long_prompt, 4)
    assert res["prompt_tokens"] > 512 and res["result"] == "PASS", {k: v for k, v in res.items() if "tokens" not in k}
    ids = eng.prompt_ids(PROMPT)
    expect = reference_greedy(ref, ids, 32)
    assert list(eng.runner.generate_ids(ids, SamplingParams(), 32, frozenset())) == expect
    assert eng.runner.info()["decode_graph_nodes"] > 0  # the whole step was one captured graph
    assert list(eng.runner.generate_ids(ids, SamplingParams(), 32, frozenset())) == expect  # replayed warm


# -- grouping the (token, slot) pairs by expert --------------------------------------------------

@pytest.mark.parametrize("n_pairs,n_expert,skew", [(4096, 128, 0.0), (4099, 37, 0.3), (1500, 1024, 0.0),
                                                    (2600, 256, 0.9), (31, 3, 0.0)])
def test_group_sorts_pairs_stably(gpu, n_pairs, n_expert, skew):
    """reflex_moe_group at prompt sizes: several chunks of pairs (a count table per warp; 8 warps a
    chunk at 1,024 experts), expert counts off 32, one expert taking most pairs (many tiles):
    the stable order, counts, offsets and the tile list equal numpy's, whatever the poison."""
    rng = np.random.default_rng([n_pairs, n_expert, int(10 * skew)])
    ids = rng.integers(0, n_expert, n_pairs).astype(np.int32)
    ids[rng.random(n_pairs) < skew] = n_expert // 2
    k = 8 if n_pairs % 8 == 0 else 1
    max_tiles = moe.max_tiles(n_pairs, n_expert)
    counts, offsets = gpu.poisoned((n_expert,), np.int32), gpu.poisoned((n_expert,), np.int32)
    pair_tok, pair_id = gpu.poisoned((n_pairs,), np.int32), gpu.poisoned((n_pairs,), np.int32)
    tile_e, tile_m0, n_tiles = (gpu.poisoned((max_tiles,), np.int32), gpu.poisoned((max_tiles,), np.int32),
                                gpu.poisoned((1,), np.int32))
    moe.group(gpu.launch, gpu.put(ids), n_pairs, n_expert, k, counts, offsets, pair_tok, pair_id, tile_e, tile_m0,
              n_tiles)
    want = np.argsort(ids, kind="stable")
    want_counts = np.bincount(ids, minlength=n_expert)
    assert (gpu.get(counts, (n_expert,), np.int32) == want_counts).all()
    assert (gpu.get(offsets, (n_expert,), np.int32) == np.concatenate([[0], np.cumsum(want_counts)[:-1]])).all()
    assert (gpu.get(pair_id, (n_pairs,), np.int32) == want).all()
    assert (gpu.get(pair_tok, (n_pairs,), np.int32) == want // k).all()
    want_tiles = [(e, m0) for e in range(n_expert) for m0 in range(0, want_counts[e], moe.TILE)]
    got_n = int(gpu.get(n_tiles, (1,), np.int32)[0])
    assert got_n == len(want_tiles) <= max_tiles
    assert list(zip(gpu.get(tile_e, (max_tiles,), np.int32)[:got_n],
                    gpu.get(tile_m0, (max_tiles,), np.int32)[:got_n])) == want_tiles


# -- experts, grouped prefill on sm_80+ (gemm.cu): two launches for all experts ------------------

@pytest.mark.parametrize("qtype", [Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q5_0, Q.Q4_K, Q.Q5_K, Q.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok,n_expert,k,skewed", [(1, 8, 2, False), (70, 8, 3, False), (130, 5, 2, True),
                                                      (300, 64, 8, False)])
@pytest.mark.parametrize("tile", [moe.TILE, moe.SMALL_TILE])
def test_grouped_experts_gemm(gpu, qtype, n_tok, n_expert, k, skewed, tile):
    """reflex_moe_group's tile list, then gate+up+act for every expert in one launch and down with
    the weighted sum into the residual in another, against numpy, with 64-pair tiles and 32-pair
    ones (their own kernels); the sum is deterministic (two runs agree bit for bit) and the
    completion counters are left at zero."""

    if tuple(gpu.dev.cc) < (8, 0):
        pytest.skip("the sm_80+ kernels need an sm_80+ GPU")
    rng = np.random.default_rng([int(qtype), n_tok, n_expert, k, skewed, 80])
    E, F = k_for(qtype, True), _ff_for(qtype, True)
    (wg, wu, wd), (dg, du, dd) = _experts(gpu, qtype, n_expert, E, F, rng)
    logits = rng.standard_normal((n_tok, n_expert)).astype(np.float32)
    if skewed:  # every token's first choice is expert 3: one group of n_tok > 2 tiles
        logits[:, 3] = 10
    ids, w = _route(logits, k, True)
    ids = ids.astype(np.int32)
    pairs, max_tiles = n_tok * k, moe.max_tiles(n_tok * k, n_expert, tile)
    grp = MoeGroups(gpu.poisoned((n_expert,), np.int32), gpu.poisoned((n_expert,), np.int32),
                    gpu.poisoned((pairs,), np.int32), gpu.poisoned((pairs,), np.int32),
                    gpu.poisoned((max_tiles,), np.int32), gpu.poisoned((max_tiles,), np.int32),
                    gpu.poisoned((1,), np.int32), max_tiles, tile)
    moe.group(gpu.launch, gpu.put(ids), pairs, n_expert, k, grp.counts, grp.offsets, grp.pair_tok, grp.pair_id,
              grp.tile_e, grp.tile_m0, grp.n_tiles, tile)
    counts = np.bincount(ids.reshape(-1), minlength=n_expert)
    want_tiles = [(e, m0) for e in range(n_expert) for m0 in range(0, counts[e], tile)]
    n_tiles = int(gpu.get(grp.n_tiles, (1,), np.int32)[0])
    assert n_tiles == len(want_tiles) <= max_tiles
    got_tiles = list(zip(gpu.get(grp.tile_e, (max_tiles,), np.int32)[:n_tiles],
                         gpu.get(grp.tile_m0, (max_tiles,), np.int32)[:n_tiles]))
    assert got_tiles == want_tiles
    order = np.argsort(ids.reshape(-1), kind="stable")  # pair ids by expert, then pair order
    assert (gpu.get(grp.pair_id, (pairs,), np.int32) == order).all()

    check_expert_gemms(gpu, rng, qtype, n_tok, k, ids, w, grp, (wg, wu, wd), (dg, du, dd), order)


def host_groups(gpu, ids, n_expert, tile):
    """reflex_moe_group's outputs computed here (for the CPU emulation, which runs gemm.cu only)."""
    k, flat = ids.shape[1], ids.reshape(-1)
    order = np.argsort(flat, kind="stable")
    counts = np.bincount(flat, minlength=n_expert).astype(np.int32)
    offsets = (np.cumsum(counts) - counts).astype(np.int32)
    tiles = [(e, m0) for e in range(n_expert) for m0 in range(0, counts[e], tile)]
    te, tm = (np.array([t[i] for t in tiles], np.int32) for i in (0, 1))
    grp = MoeGroups(gpu.put(counts), gpu.put(offsets), gpu.put((order // k).astype(np.int32)),
                    gpu.put(order.astype(np.int32)), gpu.put(te), gpu.put(tm),
                    gpu.put(np.array([len(tiles)], np.int32)), len(tiles), tile)
    return grp, order


def check_expert_gemms(gpu, rng, qtype, n_tok, k, ids, w, grp, weights, dense, order):
    """gemm.to_half, moe_glu and moe_down over grp's tiles against float64 numpy: f16 input rows
    (exactly the rounded floats), f16 act rows (every routed row written: outputs NaN-poisoned),
    then the weighted sum into the residual, deterministic over two launches, counters left zero."""
    (wg, wu, wd), (dg, du, dd) = weights, dense
    E, F = dg.shape[2], dg.shape[1]
    pairs = n_tok * k
    # gate + up + SiLU into act, rows in expert order; inputs scaled so gate/up outputs are O(1)
    h = (rng.standard_normal((n_tok, E)) / (dg.std() * np.sqrt(E))).astype(np.float32)
    xh = gpu.poisoned((n_tok, E), np.float16)
    gemm.to_half(gpu.launch, gpu.put(h), xh, n_tok * E)
    assert np.array_equal(gpu.get(xh, (n_tok, E), np.float16), h.astype(np.float16))
    act = gpu.poisoned((pairs, F), np.float16)
    gemm.moe_glu(gpu.launch, wg, wu, F * wg.row_bytes, F, grp, xh, act, 0)
    got_act = gpu.get(act, (pairs, F), np.float16).astype(np.float32)
    assert not np.isnan(got_act).any(), "a routed row was left unwritten"
    for i, p in enumerate(order):
        t, e = p // k, ids.flat[p]
        g, u = h[t].astype(np.float64) @ dg[e].T, h[t].astype(np.float64) @ du[e].T
        bg, bu = _bound(h[t:t + 1], dg[e])[0], _bound(h[t:t + 1], du[e])[0]
        want = act_ref(g, 0) * u
        # f16 inputs (test_gpu_kernels), then the f16 store: half an ulp of 2^-10
        tol = 1.2 * 2e-3 * (bg * np.abs(u) + (np.abs(g) + bg) * bu) + 2 ** -11 * np.abs(want) + 1e-5
        assert (np.abs(got_act[i] - want) <= tol).all(), (i, p, e)

    # down, weighted, summed over each token's slots into the residual
    base = rng.standard_normal((n_tok, E)).astype(np.float32)
    counters = gpu.put(np.zeros(n_tok * gemm.down_col_tiles(E), np.int32))
    ybuf = gpu.poisoned((pairs, E))
    w_d = gpu.put(w)
    results = []
    for _ in range(2):
        x = gpu.put(base)
        gemm.moe_down(gpu.launch, wd, E * wd.row_bytes, E, grp, act, w_d, k, ybuf, x, counters)
        results.append(gpu.get(x, (n_tok, E)))
        assert not gpu.get(counters, (n_tok * gemm.down_col_tiles(E),), np.int32).any(), "counters not reset"
    assert np.array_equal(results[0], results[1]), "the weighted sum depends on the schedule"
    expect, tol = base.astype(np.float64), np.full((n_tok, E), 1e-4)
    for i, p in enumerate(order):
        t, e = p // k, ids.flat[p]
        expect[t] += w.flat[p] * (got_act[i].astype(np.float64) @ dd[e].T)
        tol[t] += 2e-3 * w.flat[p] * _bound(got_act[i:i + 1], dd[e])[0]
    assert (np.abs(results[0] - expect) <= tol).all(), np.abs(results[0] - expect).max()


# -- a prompt's float32 router: tiled GEMM ---------------------------------------------------------

@pytest.mark.parametrize("rows,n_tok,k", [((128,), 512, 2048), ((64,), 17, 1024), ((256, 1), 301, 2048),
                                          ((100, 7, 3), 45, 576)])
@pytest.mark.parametrize("fused_norm", [True, False])
@pytest.mark.parametrize("sliced", [False, True])
def test_router_logits_of_a_prompt(gpu, rows, n_tok, k, fused_norm, sliced):
    """moe.router_mm: float32 rows in up to three segments (a router and a shared expert's gate),
    tiles of 32 tokens x 32 rows cut short at both edges, the RMS norm applied to the sums; float64
    reference, outputs NaN-poisoned first. Sliced: K cut into 4, 8 and 2 slices where the tiles
    leave SMs idle (576 = 9 steps: none), summed by each tile's last block in slice order: the
    same bits on a second launch, the counters left zeroed. Fewer than 16 tokens, or
    REFLEX_ROUTER_MM=0, leave it to the matrix-vector kernel."""
    rng = np.random.default_rng([sum(rows), n_tok, k, fused_norm])
    mats = [random_weight(gpu, Q.F32, r, k, rng) for r in rows]
    x = (rng.standard_normal((n_tok, k)) * 3).astype(np.float32)
    nw = (rng.random(k) + 0.5).astype(np.float32)
    L = gpu.launch
    scratch = (0, 0)
    if sliced:
        (_, n_part), (_, n_ctr) = moe.router_mm_scratch()
        scratch = (gpu.poisoned((n_part,)), gpu.put(np.zeros(n_ctr, np.int32)))
    runs = []
    for _ in range(2 if sliced else 1):
        ys = [gpu.poisoned((n_tok, w.rows)) for w, _ in mats]
        with L.record() as rec:
            assert moe.router_mm(L, [w for w, _ in mats], gpu.put(x), ys, n_tok, gpu.put(nw) if fused_norm else 0,
                                 1e-6, scratch)
        assert [ln.kernel.name for ln in rec] == ["reflex_moe_router_mm"]
        want = {((128,), 512): 4, ((64,), 17): 8, ((256, 1), 301): 2}.get((rows, n_tok), 1) if sliced else 1
        assert rec[0].grid[2] == want, rec[0].grid
        runs.append([gpu.get(y, (n_tok, w.rows)) for (w, _), y in zip(mats, ys)])
    if sliced:
        assert all((a == b).all() for a, b in zip(*runs)), "the slices must add up in the same order every launch"
        assert not gpu.get(scratch[1], (moe.ROUTER_MM_MAX_PARTS,), np.int32).any(), "counters left non-zero"
    xn = rms_ref(x, nw, 1e-6) if fused_norm else x.astype(np.float64)
    for (w, dense), got in zip(mats, runs[0]):
        assert not np.isnan(got).any(), "the kernel left poisoned outputs"
        expect = xn @ dense.T.astype(np.float64)
        bound = 3e-5 * (np.abs(xn) @ np.abs(dense).T.astype(np.float64)) + 1e-6
        assert (np.abs(got - expect) <= bound).all(), np.abs(got - expect).max()
    assert not moe.router_mm(L, [w for w, _ in mats], gpu.put(x), ys, 15, 0, 1e-6)
    saved, L.router_mm = L.router_mm, False
    try:
        assert not moe.router_mm(L, [w for w, _ in mats], gpu.put(x), ys, n_tok, 0, 1e-6)
    finally:
        L.router_mm = saved


# -- one token (decode): router + top-k fused, routed rows staged in shared memory --------------

@pytest.mark.parametrize("n_expert,k,budget_rows", [(128, 8, 4), (60, 5, 1), (8, 8, 100), (257, 3, 9)])
@pytest.mark.parametrize("normalize,shared_gate", [(True, False), (False, False), (True, True)])
def test_fused_router_topk_one_token(gpu, n_expert, k, budget_rows, normalize, shared_gate):
    """shared_gate: a 1-row product of the same input (Qwen3.5's shared-expert gate) in one more
    block of the launch, outside the top-k."""
    rng = np.random.default_rng([n_expert, k, budget_rows, normalize, shared_gate])
    E = 640
    w, dense = random_weight(gpu, Q.F32, n_expert, E, rng)
    g, g_dense = random_weight(gpu, Q.F32, 1, E, rng)
    y2 = gpu.poisoned((1, 1))
    also = [(g, y2)] if shared_gate else []
    x = rng.standard_normal((1, E)).astype(np.float32)
    nw = (rng.random(E) + 0.5).astype(np.float32)
    L = gpu.launch
    saved = L.mvs_budget
    L.mvs_budget = budget_rows * w.row_bytes + 64
    try:
        logits, ids, wts = gpu.poisoned((1, n_expert)), gpu.poisoned((1, k), np.int32), gpu.poisoned((1, k))
        counter = gpu.put(np.zeros(1, np.int32))
        for replay in range(2):  # the counter is left at zero for the next layer and step
            with L.record() as rec:
                assert moe_decode.router_topk(L, w, gpu.put(x), gpu.put(nw), 1e-6, logits, k, normalize, ids, wts, counter,
                                              also=also)
            assert [ln.kernel.name for ln in rec] == ["reflex_moe_router_f32"]
            got_logits = gpu.get(logits, (1, n_expert))
            xn = rms_ref(x, nw, 1e-6)
            np.testing.assert_allclose(got_logits, xn @ dense.T.astype(np.float64), rtol=1e-4, atol=1e-4)
            if shared_gate:
                np.testing.assert_allclose(gpu.get(y2, (1, 1)), xn @ g_dense.T.astype(np.float64), rtol=1e-4, atol=1e-4)
            want_ids, want_w = _route(got_logits, k, normalize)  # routing of the logits the GPU computed
            assert (gpu.get(ids, (1, k), np.int32) == want_ids).all()
            np.testing.assert_allclose(gpu.get(wts, (1, k)), want_w, rtol=2e-6, atol=1e-7)
            assert gpu.get(counter, (1,), np.int32)[0] == 0
    finally:
        L.mvs_budget = saved


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q5_0, Q.Q4_K, Q.Q5_K, Q.Q6_K],
                         ids=lambda t: t.name)
@pytest.mark.parametrize("n_expert,k,budget_rows", [(8, 2, 1000), (12, 6, 5), (40, 8, 3)])
@pytest.mark.parametrize("early", [False, True])
def test_staged_experts_one_token(gpu, qtype, n_expert, k, budget_rows, early):
    rng = np.random.default_rng([int(qtype), n_expert, k, budget_rows, early])
    _staged_experts_one_token(gpu, rng, qtype, n_expert, k, budget_rows, early, k_for(qtype, False),
                              _ff_for(qtype, False))


@pytest.mark.parametrize("qtype", [Q.F16, Q.Q8_0, Q.Q4_K, Q.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("wide", ["ff2", "embd4"])
def test_staged_experts_one_token_wide_rows(gpu, qtype, wide):
    """Rows longer than one warp's 1,024 weights: the down kernel's (slot, row) split with 2 warps
    per row (an expert FFN as wide as DeepSeek-V2-Lite's 1,408), and gate/up with 4 (E > 2,048)."""
    rng = np.random.default_rng([int(qtype), len(wide)])
    blocks = 256 if qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K) else 32
    if wide == "ff2":  # down: K = F in (1024, 2048]
        E, F = k_for(qtype, False), (1280 if blocks == 256 else 1376)
    else:  # gate / up: K = E in (2048, 4096]
        E, F = (2304 if blocks == 256 else 2080), _ff_for(qtype, False)
    _staged_experts_one_token(gpu, rng, qtype, 12, 8, 3, True, E, F)


@pytest.mark.parametrize("qtype", [Q.F16, Q.Q8_0, Q.Q4_K, Q.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("n_expert,k,budget_rows", [(12, 6, 5), (40, 8, 3), (8, 2, 1000)])
@pytest.mark.parametrize("early", [False, True])
def test_staged_experts_with_a_shared_slot(gpu, qtype, n_expert, k, budget_rows, early):
    """A shared expert of the experts' shape as slot k of both launches (Qwen3.5-MoE at decode):
    its gate/up at act[k], its down weighted by sigmoid(logit) (or 1 without a logit)."""
    rng = np.random.default_rng([int(qtype), n_expert, k, budget_rows, early, 7])
    _staged_experts_one_token(gpu, rng, qtype, n_expert, k, budget_rows, early, k_for(qtype, False),
                              _ff_for(qtype, False), shared=True, gated=budget_rows != 1000)


def _staged_experts_one_token(gpu, rng, qtype, n_expert, k, budget_rows, early, E, F, shared=False, gated=True):
    (wg, wu, wd), (dg, du, dd) = _experts(gpu, qtype, n_expert, E, F, rng)
    sh_w, logit = None, 0.0
    if shared:  # slot k: one more expert's weights, elsewhere in memory
        sh_w, (sg, su, sd) = _experts(gpu, qtype, 1, E, F, rng)
        dg, du, dd = np.concatenate([dg, sg]), np.concatenate([du, su]), np.concatenate([dd, sd])
        logit = float(rng.standard_normal() * 2) if gated else 0.0
    x = (rng.standard_normal((1, E)) * 0.5).astype(np.float32)
    nw = (rng.random(E) + 0.5).astype(np.float32)
    ids, w = _route(rng.standard_normal((1, n_expert)).astype(np.float32), k, True)
    ids_d, w_d = gpu.put(ids.astype(np.int32)), gpu.put(w)
    slots = k + shared
    all_ids = np.append(ids.flat, n_expert)  # slot k reads the shared expert (index n_expert above)
    all_w = np.append(w.flat, 1 / (1 + np.exp(-logit)) if gated else 1.0)
    L = gpu.launch
    saved = L.mvs_budget
    L.mvs_budget = budget_rows * wg.row_bytes * 2 + 64
    try:
        act = gpu.poisoned((slots, F))
        with L.record() as rec:
            assert mvs.expert_glu(L, wg, wu, F * wg.row_bytes, ids_d, k, gpu.put(x), act, F, 0, gpu.put(nw), 1e-6,
                                  shared=sh_w[:2] if shared else None)
        assert rec[0].grid[1] == slots
        got_act = gpu.get(act, (slots, F))
        xn = rms_ref(x, nw, 1e-6)
        assert not np.isnan(got_act).any(), "the kernel left poisoned outputs"
        for s in range(slots):
            e = all_ids[s]
            g, u = xn[0] @ dg[e].T, xn[0] @ du[e].T
            tol = 6e-4 * _bound(xn, dg[e])[0] * _bound(xn, du[e])[0] + 1e-5
            assert (np.abs(got_act[s] - act_ref(g, 0) * u) <= tol).all(), (s, np.abs(got_act[s] - act_ref(g, 0) * u).max())
        base = rng.standard_normal((1, E)).astype(np.float32)
        xd = gpu.put(base)
        L.mvs_budget = budget_rows * slots * wd.row_bytes + 4 * slots * F + 128
        with L.record() as rec2:
            assert moe_decode.down(L, wd, E * wd.row_bytes, ids_d, w_d, k, act, xd, E, early,
                                   shared=sh_w[2] if shared else None,
                                   shared_logit=gpu.put(np.array([logit], np.float32)) if shared and gated else 0)
        assert [ln.kernel.name for ln in rec + rec2] == [f"reflex_mvs_glu_{wg.suffix}", f"reflex_moe_mvs_down_{wd.suffix}"]
        expect, tol = base[0].astype(np.float64), np.full(E, 1e-5)
        for s in range(slots):
            e = all_ids[s]
            expect += all_w[s] * (got_act[s].astype(np.float64) @ dd[e].T)
            tol += 2e-4 * all_w[s] * _bound(got_act[s:s + 1], dd[e])[0]
        got = gpu.get(xd, (1, E))[0]
        assert (np.abs(got - expect) <= tol).all(), np.abs(got - expect).max()
    finally:
        L.mvs_budget = saved
