"""Every CUDA kernel against numpy, on fresh random inputs at awkward sizes (not multiples of the
block or tile), with outputs poisoned with NaN so an element the kernel forgets shows up.

Run on a GPU machine: pytest -m gpu tests/test_gpu_kernels.py
"""

import ctypes

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from gpu_harness import TYPE_NAMES, k_for, tree_batch
from gpu_harness import act_ref as _act
from gpu_harness import random_weight as weight
from gpu_harness import rms_ref as _rms

from reflex_runtime.gpu import products
from reflex_runtime.gpu.ops import attention, attn_decode, embed, flash_attn, gemm, matvec, mvs, norm, rope
from reflex_runtime.gpu.ops import logits as logit_ops
from reflex_runtime.gpu.ops import sample as sample_ops
from reflex_runtime.gpu.ops.sample import ARGMAX_PARTS, RxSampling, RxState

pytestmark = pytest.mark.gpu


def assert_matmul_close(got, x, dense, base=None, rtol=1e-4):
    expect = x.astype(np.float64) @ dense.T.astype(np.float64)
    if base is not None:
        expect = expect + base
    bound = rtol * (np.abs(x).astype(np.float64) @ np.abs(dense).T.astype(np.float64) + 1e-6)
    assert not np.isnan(got).any(), "the kernel left poisoned outputs"
    err = np.abs(got - expect)
    assert (err <= bound).all(), f"max err {err.max():.3e} (bound there {bound.flat[err.argmax()]:.3e})"


@pytest.mark.parametrize("qtype", list(TYPE_NAMES), ids=lambda t: t.name)
@pytest.mark.parametrize("rows,n_tok", [(1, 1), (37, 3), (1000, 8), (129, 5)])
@pytest.mark.parametrize("accumulate", [False, True])
def test_matvec(gpu, qtype, rows, n_tok, accumulate):
    rng = np.random.default_rng([int(qtype), rows, n_tok, accumulate])
    k = k_for(qtype, False)
    w, dense = weight(gpu, qtype, rows, k, rng)
    x = rng.standard_normal((n_tok, k)).astype(np.float32)
    base = rng.standard_normal((n_tok, rows)).astype(np.float32) if accumulate else None
    y = gpu.put(base) if accumulate else gpu.poisoned((n_tok, rows))
    products.matmul(gpu.launch, w, gpu.put(x), y, n_tok, accumulate=accumulate)
    assert_matmul_close(gpu.get(y, (n_tok, rows)), x, dense, base)


@pytest.mark.parametrize("qtype", [Q.F16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("rows,k", [(64, 3072), (96, 1024), (1500, 2048)])
def test_matvec_split_k_across_warps(gpu, qtype, rows, k):
    """Few rows and long rows: several warps share each row (the decode shapes of a real model)."""
    wpr = matvec.warps_per_row(gpu.launch, rows, k)
    rng = np.random.default_rng([int(qtype), rows, k])
    w, dense = weight(gpu, qtype, rows, k, rng)
    for n_tok in (1, 3):
        x = rng.standard_normal((n_tok, k)).astype(np.float32)
        y = gpu.poisoned((n_tok, rows))
        products.matmul(gpu.launch, w, gpu.put(x), y, n_tok)
        assert_matmul_close(gpu.get(y, (n_tok, rows)), x, dense)
    assert (wpr > 1) == (k >= 2048)  # the split only pays for rows of 2048+ weights


@pytest.mark.parametrize("qtype", [Q.F16, Q.Q8_0, Q.Q5_0, Q.Q4_1, Q.Q5_1, Q.Q4_K, Q.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("rows,fused_norm", [(4100, False), (8200, True), (8192, False)])
def test_matvec_rows_per_warp(gpu, qtype, rows, fused_norm):
    """Many rows, one token: each warp applies one x load to 2 or 4 rows (the LM head's shape)."""
    rng = np.random.default_rng([int(qtype), rows, fused_norm])
    k = 256
    w, dense = weight(gpu, qtype, rows, k, rng)
    assert matvec.rows_per_warp([rows], 1, matvec.warps_per_row(gpu.launch, rows, k)) > 1
    x = (rng.standard_normal((1, k)) * 3).astype(np.float32)
    nw = (rng.random(k) + 0.5).astype(np.float32)
    y = gpu.poisoned((1, rows))
    products.matmul(gpu.launch, w, gpu.put(x), y, 1, norm_w=gpu.put(nw) if fused_norm else 0, eps=1e-6)
    xe = _rms(x, nw, 1e-6).astype(np.float32) if fused_norm else x
    assert_matmul_close(gpu.get(y, (1, rows)), xe, dense, rtol=2e-4)


@pytest.mark.parametrize("qtype", [Q.F32, Q.BF16, Q.Q8_0, Q.Q5_0, Q.Q4_1, Q.Q5_1, Q.Q4_K, Q.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok", [1, 6])
def test_matvec_segments_with_fused_norm(gpu, qtype, n_tok):
    """q, k and v in one launch, with the pre-attention RMSNorm folded into the kernel."""
    rng = np.random.default_rng([int(qtype), n_tok, 7])
    k, eps = k_for(qtype, False), 1e-6
    mats = [weight(gpu, qtype, rows, k, rng) for rows in (96, 40, 33)]
    x = (rng.standard_normal((n_tok, k)) * 4).astype(np.float32)
    nw = (rng.random(k) + 0.5).astype(np.float32)
    ys = [gpu.poisoned((n_tok, w.rows)) for w, _ in mats]
    products.segments(gpu.launch, [w for w, _ in mats], gpu.put(x), ys, n_tok, norm_w=gpu.put(nw), eps=eps)
    xn = _rms(x, nw, eps).astype(np.float32)
    for (w, dense), y in zip(mats, ys):
        assert_matmul_close(gpu.get(y, (n_tok, w.rows)), xn, dense, rtol=2e-4)


@pytest.mark.parametrize("qtype", [Q.F32, Q.Q8_0, Q.Q4_K], ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok,long_rows", [(17, False), (301, False), (301, True)])
@pytest.mark.parametrize("accumulate", [False, True])
def test_matvec_few_rows_many_tokens(gpu, qtype, n_tok, long_rows, accumulate):
    """A prompt through a few rows (a router, Qwen3.5's gates): the tokens spread over the grid's
    y (matvec.token_blocks), each block an even run of whole 4-token steps, the last one short.
    Rows of 2,048: two warps share each row (their reduction's barriers) and the last y blocks
    get no token at all (301 tokens over 43 blocks of 8)."""
    rng = np.random.default_rng([int(qtype), n_tok, long_rows, accumulate])
    k, eps = 2048 if long_rows else k_for(qtype, False), 1e-6
    mats = [weight(gpu, qtype, rows, k, rng) for rows in (64, 33)]
    x = (rng.standard_normal((n_tok, k)) * 4).astype(np.float32)
    nw = (rng.random(k) + 0.5).astype(np.float32)
    bases = [rng.standard_normal((n_tok, w.rows)).astype(np.float32) for w, _ in mats]
    ys = [gpu.put(b) if accumulate else gpu.poisoned((n_tok, w.rows)) for b, (w, _) in zip(bases, mats)]
    with gpu.launch.record() as rec:
        products.segments(gpu.launch, [w for w, _ in mats], gpu.put(x), ys, n_tok, accumulate, norm_w=gpu.put(nw),
                          eps=eps)
    assert [ln.kernel.name for ln in rec] == [f"reflex_mv_{mats[0][0].suffix}"] and rec[0].grid[1] > 1
    xn = _rms(x, nw, eps).astype(np.float32)
    for (w, dense), y, base in zip(mats, ys, bases):
        assert_matmul_close(gpu.get(y, (n_tok, w.rows)), xn, dense, base if accumulate else None, rtol=2e-4)


@pytest.fixture(params=["sm80", "wmma"])
def tc_generation(request, gpu):
    """Run a test through the sm_80+ prompt kernels (gemm.cu, flash_attn.cu) and again through
    the older tensor-core path (matmul.cu's WMMA tiles) that pre-sm_80 GPUs take."""
    tc = request.param == "sm80"
    if tc and tuple(gpu.dev.cc) < (8, 0):
        pytest.skip("the sm_80+ kernels need an sm_80+ GPU")
    saved = gpu.launch.tc
    gpu.launch.tc = tc
    yield request.param
    gpu.launch.tc = saved


# Tensor-core tolerance: x and w are each rounded to f16 (relative error <= 2^-11 each), so every
# product is within ~2^-10 of exact and the f32 sum within 2e-3 of sum |x| |w| (with margin).
TC_RTOL = 2e-3


@pytest.mark.parametrize("qtype", list(TYPE_NAMES), ids=lambda t: t.name)
@pytest.mark.parametrize("rows,n_tok", [(130, 64), (257, 70), (64, 130)])
def test_tensor_core_matmul(gpu, tc_generation, qtype, rows, n_tok):
    from reflex_runtime.gpu.products import MM_MIN_TOKENS

    assert n_tok >= MM_MIN_TOKENS  # these sizes take the tensor-core kernel
    rng = np.random.default_rng([int(qtype), rows, n_tok])
    k = k_for(qtype, True)
    w, dense = weight(gpu, qtype, rows, k, rng)
    x = rng.standard_normal((n_tok, k)).astype(np.float32)
    y = gpu.poisoned((n_tok, rows))
    n0 = gpu.launch.launches
    products.matmul(gpu.launch, w, gpu.put(x), y, n_tok)
    assert gpu.launch.launches == n0 + 1
    assert_matmul_close(gpu.get(y, (n_tok, rows)), x, dense, rtol=TC_RTOL)
    base = rng.standard_normal((n_tok, rows)).astype(np.float32)
    y2 = gpu.put(base)
    products.matmul(gpu.launch, w, gpu.put(x), y2, n_tok, accumulate=True)
    assert_matmul_close(gpu.get(y2, (n_tok, rows)), x, dense, base, rtol=TC_RTOL)


def _sm80(gpu):
    if tuple(gpu.dev.cc) < (8, 0):
        pytest.skip("the sm_80+ kernels need an sm_80+ GPU")


# K at block boundaries: one and several 256-blocks; 32-blocks making a partial last pipeline
# stage of 128 (416 = 3.25 stages, 13 blocks: Q8_0/Q5_0 rows of 442/286 bytes, only 2-byte
# aligned), Gemma 270M's 640 (Q8_0/Q5_0 rows 8-byte aligned) and whole stages (1024).
def _gemm_ks(qtype):
    from quant_blocks import LAYOUT

    if LAYOUT[qtype][0] == 256:
        return [256, 768]
    return [416, 640, 1024] if LAYOUT[qtype][0] == 32 else [96, 416]


@pytest.mark.parametrize("qtype", list(TYPE_NAMES), ids=lambda t: t.name)
@pytest.mark.parametrize("cfg", ["l", "s"])
def test_gemm_every_type_and_tile(gpu, qtype, cfg):
    """gemm.cu against numpy: three segments (q, k, v) of odd row counts in one launch, tokens
    from 1 to more than two tiles, K at block boundaries, plain and accumulating."""
    _sm80(gpu)
    for k in _gemm_ks(qtype):
        rng = np.random.default_rng([int(qtype), k, ord(cfg)])
        mats = [weight(gpu, qtype, rows, k, rng) for rows in (131, 40, 257)]
        for n_tok in (1, 17, 129, 300):
            x = rng.standard_normal((n_tok, k)).astype(np.float32)
            xd = gpu.put(x)
            ys = [gpu.poisoned((n_tok, w.rows)) for w, _ in mats]
            gemm.gemm(gpu.launch, [w for w, _ in mats], xd, ys, n_tok, cfg=cfg)
            for (w, dense), y in zip(mats, ys):
                assert_matmul_close(gpu.get(y, (n_tok, w.rows)), x, dense, rtol=TC_RTOL)
            w, dense = mats[2]
            base = rng.standard_normal((n_tok, w.rows)).astype(np.float32)
            y = gpu.put(base)
            gemm.gemm(gpu.launch, [w], xd, [y], n_tok, accumulate=True, cfg=cfg)
            assert_matmul_close(gpu.get(y, (n_tok, w.rows)), x, dense, base, rtol=TC_RTOL)


@pytest.mark.parametrize("qtype", list(TYPE_NAMES), ids=lambda t: t.name)
@pytest.mark.parametrize("cfg", ["l", "s"])
def test_gemm_prompt_split_k_sums_in_slice_order(gpu, qtype, cfg):
    """A prompt's product whose tiles fill less than the GPU twice splits K when the Launcher has
    a scratch (a model's arena gives it one): three segments of odd row counts and one, plain and
    accumulating, K at awkward sizes, against numpy; the same bits on a second run (the tile's last
    slice sums them in slice order), and the counters left at zero for the next launch."""
    _sm80(gpu)
    L = gpu.launch
    L.gemm_part = gpu.poisoned((gemm.PART_FLOATS,))
    L.gemm_counters = gpu.put(np.zeros(gemm.PART_COUNTERS, np.int32))
    try:
        for k in _gemm_ks(qtype) + [2048]:
            rng = np.random.default_rng([int(qtype), k, 38])
            mats = [weight(gpu, qtype, rows, k, rng) for rows in (131, 40, 257)]
            stages = -(-k // gemm.stage_weights(mats[0][0].type_name))
            for n_tok in (3, 17, 64, 129):
                bm, bn = gemm.CFGS[cfg]
                blocks = sum(-(-w.rows // bn) for w, _ in mats) * -(-n_tok // bm)
                z, part = gemm.k_splits(L, mats[0][0], blocks, False, n_tok, sum(w.rows for w, _ in mats))
                assert (z > 1 and part == L.gemm_part) or stages == 1, (k, n_tok, z)
                x = rng.standard_normal((n_tok, k)).astype(np.float32)
                xd = gpu.put(x)
                runs = []
                for _ in range(2):
                    ys = [gpu.poisoned((n_tok, w.rows)) for w, _ in mats]
                    gemm.gemm(L, [w for w, _ in mats], xd, ys, n_tok, cfg=cfg)
                    runs.append([gpu.get(y, (n_tok, w.rows)) for (w, _), y in zip(mats, ys)])
                for (w, dense), got, again in zip(mats, *runs):
                    assert_matmul_close(got, x, dense, rtol=TC_RTOL)
                    np.testing.assert_array_equal(got, again)
                w, dense = mats[1]
                base = rng.standard_normal((n_tok, w.rows)).astype(np.float32)
                y = gpu.put(base)
                gemm.gemm(L, [w], xd, [y], n_tok, accumulate=True, cfg=cfg)
                assert_matmul_close(gpu.get(y, (n_tok, w.rows)), x, dense, base, rtol=TC_RTOL)
        assert not gpu.get(L.gemm_counters, (gemm.PART_COUNTERS,), np.int32).any()
        L.prompt_splits = False  # the knob off: one slice
        assert gemm.k_splits(L, mats[0][0], 4, True, 3, 428) == (1, 0)
    finally:
        L.gemm_part = L.gemm_counters = 0
        L.prompt_splits = True


def test_gemm_reads_x_with_a_row_stride(gpu):
    """x rows longer than K (a strided view), more tokens than one grid row of tiles."""
    _sm80(gpu)
    rng = np.random.default_rng(77)
    k, stride, n_tok, rows = 512, 520, 1100, 96
    w, dense = weight(gpu, Q.Q8_0, rows, k, rng)
    x = rng.standard_normal((n_tok, stride)).astype(np.float32)
    y = gpu.poisoned((n_tok, rows))
    gemm.gemm(gpu.launch, [w], gpu.put(x), [y], n_tok, x_stride=stride)
    assert_matmul_close(gpu.get(y, (n_tok, rows)), x[:, :k], dense, rtol=TC_RTOL)


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q5_0, Q.Q4_K, Q.Q5_K, Q.Q6_K],
                         ids=lambda t: t.name)
@pytest.mark.parametrize("cfg", ["l", "s"])
@pytest.mark.parametrize("act", [0, 1])
def test_gemm_gate_up_fused(gpu, qtype, cfg, act):
    """act(gate x) * (up x) in one pass: rows not a multiple of the tile's output columns."""
    _sm80(gpu)
    rng = np.random.default_rng([int(qtype), ord(cfg), act])
    k, rows = _gemm_ks(qtype)[0], 203
    wg, dg = weight(gpu, qtype, rows, k, rng)
    wu, du = weight(gpu, qtype, rows, k, rng)
    for n_tok in (1, 70, 257):
        x = (rng.standard_normal((n_tok, k)) / np.sqrt(k) / max(dg.std(), 1e-3)).astype(np.float32)
        out = gpu.poisoned((n_tok, rows))
        gemm.glu(gpu.launch, wg, wu, gpu.put(x), out, n_tok, act, cfg=cfg)
        got = gpu.get(out, (n_tok, rows))
        g = x.astype(np.float64) @ dg.T
        u = x.astype(np.float64) @ du.T
        expect = _act(g, act) * u
        bg, bu = np.abs(x) @ np.abs(dg).T, np.abs(x) @ np.abs(du).T
        # each factor within TC_RTOL of its bound; act is 1-Lipschitz-ish (SiLU <= 1.1, GELU <= 1.13)
        tol = 1.2 * TC_RTOL * (bg * np.abs(u) + (np.abs(g) + bg) * bu) + 1e-5
        assert not np.isnan(got).any(), "the kernel left poisoned outputs"
        assert (np.abs(got - expect) <= tol).all(), np.abs(got - expect).max()


@pytest.mark.parametrize("qtype", [Q.F32, Q.Q8_0, Q.Q4_1, Q.Q5_1, Q.Q4_K, Q.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("act", [0, 1])
@pytest.mark.parametrize("n_tok,fused_norm", [(1, False), (5, False), (40, False), (70, False), (1, True), (3, True)])
def test_gated_ffn_input(gpu, qtype, act, n_tok, fused_norm):
    rng = np.random.default_rng([int(qtype), act, n_tok, fused_norm])
    k, rows = k_for(qtype, True), 211
    wg, dg = weight(gpu, qtype, rows, k, rng)
    wu, du = weight(gpu, qtype, rows, k, rng)
    x_in = (rng.standard_normal((n_tok, k)) * 0.5).astype(np.float32)
    nw = (rng.random(k) + 0.5).astype(np.float32)
    x = _rms(x_in, nw, 1e-6).astype(np.float32) if fused_norm else x_in
    out = gpu.poisoned((n_tok, rows))
    g_buf, u_buf = gpu.poisoned((n_tok, rows)), gpu.poisoned((n_tok, rows))
    products.gated_ffn_in(gpu.launch, wg, wu, gpu.put(x_in), out, n_tok, act, g_buf, u_buf,
                          norm_w=gpu.put(nw) if fused_norm else 0, eps=1e-6)
    got = gpu.get(out, (n_tok, rows))
    g = x.astype(np.float64) @ dg.T
    u = x.astype(np.float64) @ du.T
    with np.errstate(over="ignore"):
        expect = _act(g, act) * u
    from reflex_runtime.gpu.products import MM_MIN_TOKENS

    rtol = 2e-3 if n_tok >= MM_MIN_TOKENS else 1e-4  # f16 tensor-core inputs vs f32 matrix-vector
    tol = 3 * rtol * (np.abs(x) @ np.abs(dg).T) * (np.abs(x) @ np.abs(du).T) + 1e-5
    assert not np.isnan(got).any()
    assert (np.abs(got - expect) <= tol).all(), np.abs(got - expect).max()


@pytest.mark.parametrize("qtype", list(TYPE_NAMES), ids=lambda t: t.name)
def test_embedding_rows(gpu, qtype):
    rng = np.random.default_rng(int(qtype))
    vocab, k = 301, k_for(qtype, False)
    w, dense = weight(gpu, qtype, vocab, k, rng)
    toks = np.array([0, 300, 17, 17, -1, 301, 150], dtype=np.int32)  # repeats and two out-of-range ids
    out = gpu.poisoned((len(toks), k))
    embed.embed(gpu.launch, w, gpu.put(toks), out, len(toks), 1.75)
    got = gpu.get(out, (len(toks), k))
    for i, t in enumerate(toks):
        expect = dense[t] * 1.75 if 0 <= t < vocab else np.zeros(k, np.float32)
        np.testing.assert_allclose(got[i], expect, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("n", [640, 1000, 4096 + 40])
def test_rmsnorm_modes(gpu, n):
    rng = np.random.default_rng(n)
    rows, eps = 3, 1e-6
    src = rng.standard_normal((rows, n)).astype(np.float32) * 3
    resid = rng.standard_normal((rows, n)).astype(np.float32)
    w_src, w_out = (rng.random(n) + 0.5).astype(np.float32), (rng.random(n) + 0.5).astype(np.float32)
    # plain
    out = gpu.poisoned((rows, n))
    norm.rmsnorm(gpu.launch, gpu.put(src), gpu.put(w_out), out, rows, n, eps)
    np.testing.assert_allclose(gpu.get(out, (rows, n)), _rms(src, w_out, eps), rtol=1e-5, atol=1e-5)
    # residual add then norm
    r = gpu.put(resid)
    out = gpu.poisoned((rows, n))
    norm.rmsnorm(gpu.launch, gpu.put(src), gpu.put(w_out), out, rows, n, eps, resid=r)
    np.testing.assert_allclose(gpu.get(r, (rows, n)), resid + src, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(gpu.get(out, (rows, n)), _rms(resid + src, w_out, eps), rtol=1e-5, atol=1e-5)
    # Gemma: post-norm of src into the residual, then the next pre-norm
    r = gpu.put(resid)
    out = gpu.poisoned((rows, n))
    norm.rmsnorm(gpu.launch, gpu.put(src), gpu.put(w_out), out, rows, n, eps, resid=r, w_src=gpu.put(w_src))
    new_resid = resid + _rms(src, w_src, eps)
    np.testing.assert_allclose(gpu.get(r, (rows, n)), new_resid, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gpu.get(out, (rows, n)), _rms(new_resid, w_out, eps), rtol=1e-5, atol=1e-5)


def _rope(x, pos, rope_dim, base, freq_scale=1.0, factors=None, pairwise=False):
    x = x.astype(np.float64).copy()
    half = rope_dim // 2
    inv = base ** (-2.0 * np.arange(half) / rope_dim)
    if factors is not None:
        inv = inv / factors
    ang = pos * freq_scale * inv
    c, s = np.cos(ang), np.sin(ang)
    lo, hi = (np.arange(0, rope_dim, 2), np.arange(1, rope_dim, 2)) if pairwise else (np.arange(half), half + np.arange(half))
    a, b = x[..., lo].copy(), x[..., hi].copy()
    x[..., lo] = a * c - b * s
    x[..., hi] = a * s + b * c
    return x


ROPE_CASES = {
    # name: (head_dim, rope_dim, q/k norms, pairwise, per-pair factors, freq_scale)
    "neox_norm": (64, 64, True, False, False, 1.0),
    "neox_hd128": (128, 128, False, False, False, 1.0),
    "neox_partial": (256, 64, True, False, False, 1.0),
    "neox_hd96": (96, 96, True, False, False, 1.0),
    "pairs": (64, 64, False, True, False, 1.0),  # Llama 2, SmolLM2
    "pairs_factors": (128, 128, False, True, True, 1.0),  # Llama 3.1+ rope_freqs
    "pairs_factors_linear": (64, 64, False, True, True, 0.25),
    "pairs_partial_norm": (96, 64, True, True, False, 0.5),
    "neox_factors": (64, 48, False, False, True, 1.0),
}


# (n_tok, n_head, n_kv, heads a block: None = the launcher's choice). 7 a block leaves warps idle;
# 3 makes a group end inside the query heads; 20 gives some warps three heads (h, h + 8, h + 16).
ROPE_GROUPS = [(5, 6, 2, None), (3, 16, 4, None), (3, 16, 4, 7), (2, 16, 4, 3), (2, 16, 4, 20)]


@pytest.mark.parametrize("case", list(ROPE_CASES))
def test_qk_norm_rope_and_cache_store(gpu, case):
    check_qk_rope_store(gpu, case, *ROPE_GROUPS[0])


@pytest.mark.parametrize("groups", ROPE_GROUPS[1:], ids=str)
def test_qk_rope_store_head_groups(gpu, monkeypatch, groups):
    check_qk_rope_store(gpu, "pairs_partial_norm", *groups[:3], heads_per_block=groups[3], monkeypatch=monkeypatch)
    check_qk_rope_store(gpu, "neox_norm", *groups[:3], heads_per_block=groups[3], monkeypatch=monkeypatch)


def check_qk_rope_store(gpu, case, n_tok, n_head, n_kv, heads_per_block=None, monkeypatch=None):
    """rope.cu against the float64 norms and rotation; NaN-poisoned caches (only the slots written
    are compared; the others must stay NaN)."""
    hd, rope_dim, norm, pairwise, with_factors, freq_scale = ROPE_CASES[case]
    if heads_per_block is not None:
        monkeypatch.setattr(rope, "heads_per_block", lambda L, n_tok, n_heads: heads_per_block)
    rng = np.random.default_rng(list(case.encode()) + [n_tok, n_head])
    n_ctx, hd_v, eps, base = 40, hd, 1e-6, 1e6
    q = rng.standard_normal((n_tok, n_head, hd)).astype(np.float32)
    k = rng.standard_normal((n_tok, n_kv, hd)).astype(np.float32)
    v = rng.standard_normal((n_tok, n_kv, hd_v)).astype(np.float32)
    qn = (rng.random(hd) + 0.5).astype(np.float32)
    kn = (rng.random(hd) + 0.5).astype(np.float32)
    pos = np.array([0, 7, 300, 2999, 11], dtype=np.int32)[:n_tok]
    slot = np.array([3, 9, 0, 39, 20], dtype=np.int32)[:n_tok]
    dq = gpu.put(q)
    kc, vc = gpu.poisoned((n_kv, n_ctx, hd), np.float16), gpu.poisoned((n_kv, n_ctx, hd_v), np.float16)
    kv_pos = gpu.put(np.full(n_ctx, -1, np.int32))
    # Llama 3.1-like factors: 1 for the fast pairs, up to 8 for the slow ones, smooth between
    factors = np.interp(np.arange(rope_dim // 2), [0, rope_dim // 6, rope_dim // 3, rope_dim // 2], [1, 1, 8, 8])
    factors = (factors * (1 + 0.01 * rng.random(rope_dim // 2))).astype(np.float32) if with_factors else None
    rope.qk_rope_store(gpu.launch, dq, gpu.put(k), gpu.put(v), gpu.put(qn) if norm else 0, gpu.put(kn) if norm else 0,
                       gpu.put(pos), gpu.put(slot), kv_pos, kc, vc, n_tok, n_head, n_kv, hd, hd_v, rope_dim, base,
                       freq_scale, eps, n_ctx, freq_factors=gpu.put(factors) if with_factors else 0,
                       pairwise=pairwise)
    qe = _rms(q, qn, eps) if norm else q.astype(np.float64)
    ke = _rms(k, kn, eps) if norm else k.astype(np.float64)
    qe = np.stack([_rope(qe[t], pos[t], rope_dim, base, freq_scale, factors, pairwise) for t in range(n_tok)])
    ke = np.stack([_rope(ke[t], pos[t], rope_dim, base, freq_scale, factors, pairwise) for t in range(n_tok)])
    np.testing.assert_allclose(gpu.get(dq, q.shape), qe, rtol=1e-4, atol=1e-4)
    kc_h = gpu.get(kc, (n_kv, n_ctx, hd), np.float16).astype(np.float32)
    vc_h = gpu.get(vc, (n_kv, n_ctx, hd_v), np.float16).astype(np.float32)
    for t in range(n_tok):
        np.testing.assert_allclose(kc_h[:, slot[t]], ke[t], rtol=2e-3, atol=2e-3)
        np.testing.assert_allclose(vc_h[:, slot[t]], v[t], rtol=1e-3, atol=1e-3)
    untouched = np.setdiff1d(np.arange(n_ctx), slot)
    assert np.isnan(kc_h[:, untouched]).all() and np.isnan(vc_h[:, untouched]).all()
    kvp = gpu.get(kv_pos, (n_ctx,), np.int32)
    assert list(kvp[slot]) == list(pos)


def _attention_ref(q, kc, vc, kv_pos, q_pos, q_slot, seg_lo, prefix_len, n_kv, window, scale, softcap):
    n_tok, n_head, hd = q.shape
    n_kvh = kc.shape[0]
    group = n_head // n_kvh
    out = np.zeros((n_tok, n_head, vc.shape[2]))
    for t in range(n_tok):
        j = np.arange(min(n_kv, q_slot[t] + 1))
        ok = (j < prefix_len) | (j >= (seg_lo[t] if seg_lo is not None else 0))
        if window > 0:
            ok &= q_pos[t] - kv_pos[j] < window
        j = j[ok]
        for h in range(n_head):
            s = (kc[h // group, j].astype(np.float64) @ (q[t, h].astype(np.float64) * scale))
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            if len(j) == 0:
                continue
            p = np.exp(s - s.max())
            out[t, h] = p @ vc[h // group, j] / p.sum()
    return out


ATTN_CASES = {
    # name: (n_head, n_kv_heads, hd, n_tok, first_slot, tree, window, softcap)
    "decode_split": (16, 8, 128, 1, 150, False, 0, 0.0),
    "decode_short": (16, 8, 128, 1, 30, False, 0, 0.0),  # one slice: no merge
    "decode_long": (8, 2, 128, 1, 1500, False, 0, 0.0),  # every slice used
    "prefill_causal": (8, 2, 128, 37, 100, False, 0, 0.0),
    "gqa4_hd256": (4, 1, 256, 19, 0, False, 0, 0.0),
    "sliding_window": (4, 2, 64, 23, 60, False, 20, 0.0),
    "tree": (4, 2, 64, 12, 30, True, 0, 0.0),
    "softcap_hd32": (2, 1, 32, 5, 10, False, 0, 30.0),
    # more decode steps: GQA 8 (Qwen3-30B-A3B), Gemma 3 270M's heads, odd head size, first token
    "decode_gqa8": (32, 4, 128, 1, 700, False, 0, 0.0),
    "decode_gqa4_hd256": (4, 1, 256, 1, 333, False, 0, 0.0),
    "decode_hd96_g2": (6, 3, 96, 1, 77, False, 0, 0.0),
    "decode_first_token": (4, 2, 64, 1, 0, False, 0, 0.0),
    "decode_window": (4, 2, 64, 1, 90, False, 20, 0.0),
    "decode_softcap_hd32": (2, 1, 32, 1, 45, False, 0, 30.0),
}


def _prompt_problem(rng, n_head, n_kvh, hd, n_tok, first, n_ctx):
    """Random f16 caches of n_ctx slots (position = slot) and the f32 queries of n_tok tokens at
    slots first..: (kc, vc, q, q_slot, kv_pos)."""
    kc = rng.standard_normal((n_kvh, n_ctx, hd)).astype(np.float16)
    vc = rng.standard_normal((n_kvh, n_ctx, hd)).astype(np.float16)
    q = rng.standard_normal((n_tok, n_head, hd)).astype(np.float32)
    return kc, vc, q, np.arange(first, first + n_tok, dtype=np.int32), np.arange(n_ctx, dtype=np.int32)


@pytest.mark.parametrize("case", list(ATTN_CASES))
def test_attention(gpu, case):

    n_head, n_kvh, hd, n_tok, first, tree, window, softcap = ATTN_CASES[case]
    rng = np.random.default_rng(list(case.encode()))
    n_ctx = max(200, first + n_tok + 1)
    kc, vc, q, q_slot, kv_pos = _prompt_problem(rng, n_head, n_kvh, hd, n_tok, first, n_ctx)
    seg_lo, prefix_len = None, 0
    q_pos = q_slot.copy()
    if tree:
        prefix_len, seg_lo, q_pos = tree_batch(first, n_tok)
    n_kv = first + n_tok
    n_split = attention.SPLITS_DECODE if n_tok == 1 else 1
    scale = 1.0 / np.sqrt(hd)
    part_o = gpu.poisoned((n_tok * n_head * attention.SPLITS_DECODE * hd,))
    part_ml = gpu.poisoned((n_tok * n_head * attention.SPLITS_DECODE * 2,))
    counters = gpu.put(np.zeros(n_tok * n_head, np.int32))
    expect = _attention_ref(q, kc, vc, kv_pos, q_pos, q_slot, seg_lo, prefix_len, n_kv, window, scale, softcap)
    for replay in range(2):  # the split path must leave its counters ready for the next replay
        out = gpu.poisoned((n_tok, n_head, hd))
        attention.attention(gpu.launch, gpu.put(q), gpu.put(kc), gpu.put(vc), gpu.put(kv_pos), gpu.put(q_pos),
                            gpu.put(q_slot), gpu.put(seg_lo) if tree else 0, prefix_len,
                            gpu.put(np.array([n_kv], np.int32)), out, part_o, part_ml, counters, n_tok, n_head, n_kvh,
                            hd, hd, n_ctx, window, scale, softcap, n_split)
        np.testing.assert_allclose(gpu.get(out, (n_tok, n_head, hd)), expect, rtol=2e-4, atol=2e-4)
    assert not gpu.get(counters, (n_tok * n_head,), np.int32).any()


def _attention_ref_fast(q, kc, vc, kv_pos, q_pos, q_slot, seg_lo, prefix_len, n_kv, window, scale, softcap):
    """_attention_ref, vectorized over tokens (float32 scores for the long cases)."""
    n_tok, n_head, hd = q.shape
    group = n_head // kc.shape[0]
    j = np.arange(n_kv)
    ok = j[None, :] <= q_slot[:, None]
    if seg_lo is not None:
        ok &= (j[None, :] < prefix_len) | (j[None, :] >= seg_lo[:, None])
    if window > 0:
        ok &= (q_pos[:, None] - kv_pos[None, :n_kv]) < window
    out = np.zeros((n_tok, n_head, vc.shape[2]), np.float64)
    for h in range(n_head):
        k = kc[h // group, :n_kv].astype(np.float32)
        v = vc[h // group, :n_kv].astype(np.float32)
        for t0 in range(0, n_tok, 1024):
            sl = slice(t0, t0 + 1024)
            sc = (q[sl, h].astype(np.float32) * np.float32(scale)) @ k.T
            if softcap > 0:
                sc = softcap * np.tanh(sc / softcap)
            sc = np.where(ok[sl], sc, -np.inf)
            m = sc.max(1, keepdims=True)
            p = np.where(ok[sl], np.exp(sc - np.where(np.isfinite(m), m, 0)), 0)
            den = p.sum(1, keepdims=True)
            out[sl, h] = np.where(den > 0, (p @ v) / np.where(den > 0, den, 1), 0)
    return out


FLASH_CASES = {
    # name: (n_head, n_kv_heads, hd, n_tok, first_slot, tree, window, softcap)
    "qwen3_prompt": (16, 8, 128, 200, 0, False, 0, 0.0),  # 200 tokens: not a multiple of a block's 32
    "qwen3_chunk_after_4096": (16, 8, 128, 90, 4100, False, 0, 0.0),  # a late chunk of a long prompt
    "one_token": (16, 8, 128, 1, 333, False, 0, 0.0),
    "moe_gqa8": (32, 4, 128, 77, 30, False, 0, 0.0),
    "gemma_hd256_window": (4, 1, 256, 130, 700, False, 512, 0.0),  # the window cuts the older tiles
    "gemma_window_8": (4, 1, 256, 45, 0, False, 8, 0.0),
    "hd64_mha": (6, 6, 64, 70, 5, False, 0, 0.0),
    "gqa3_odd_rows": (12, 4, 64, 50, 11, False, 0, 0.0),  # 64 rows / 3 heads: 21 tokens, a row idle
    "tree": (4, 2, 64, 12, 30, True, 0, 0.0),
    "tree_window": (8, 2, 128, 12, 100, True, 6, 0.0),
    "softcap": (4, 2, 128, 33, 10, False, 0, 30.0),
    "long_4200": (4, 2, 128, 4200, 0, False, 0, 0.0),  # > 4096 query tokens in one launch
    "long_window_5000": (4, 1, 256, 300, 4700, False, 512, 0.0),
}


@pytest.mark.parametrize("case", list(FLASH_CASES))
def test_flash_attention(gpu, case):
    """flash_attn.cu against numpy: causal, system1 trees, sliding windows, GQA, > 4096 tokens.
    Tolerance: q is rounded to f16 (after the scale) and so is each softmax weight before P V (each
    <= 2^-11 relative); K and V are the f16 cache itself. With |v| ~ 1 the output is within ~1e-3;
    3e-3 absolute + relative leaves margin (reflex_attn, all f32 math, is held to 2e-4)."""
    _sm80(gpu)
    n_head, n_kvh, hd, n_tok, first, tree, window, softcap = FLASH_CASES[case]
    rng = np.random.default_rng(list(case.encode()))
    n_ctx = first + n_tok + 37
    kc, vc, q, q_slot, kv_pos = _prompt_problem(rng, n_head, n_kvh, hd, n_tok, first, n_ctx)
    kc[:, first + n_tok:] = np.nan  # slots past n_kv hold garbage the kernel must never use
    vc[:, first + n_tok:] = np.inf
    seg_lo, prefix_len, q_pos = None, 0, q_slot.copy()
    if tree:
        prefix_len, seg_lo, q_pos = tree_batch(first, n_tok)
        kv_pos[first:first + n_tok] = q_pos  # the cache store writes each slot's position
    n_kv = first + n_tok
    scale = 1.0 / np.sqrt(hd)
    out = gpu.poisoned((n_tok, n_head, hd))
    assert flash_attn.ok(gpu.launch, max(n_tok, 2), hd, hd, n_head, n_kvh)
    flash_attn.attention(gpu.launch, gpu.put(q), gpu.put(kc), gpu.put(vc), gpu.put(kv_pos), gpu.put(q_pos),
                         gpu.put(q_slot), gpu.put(seg_lo) if tree else 0, prefix_len,
                         gpu.put(np.array([n_kv], np.int32)), out, n_tok, n_head, n_kvh, hd, n_ctx, window, scale,
                         softcap)
    got = gpu.get(out, (n_tok, n_head, hd))
    expect = _attention_ref_fast(q, kc, vc, kv_pos, q_pos, q_slot, seg_lo, prefix_len, n_kv, window, scale, softcap)
    assert not np.isnan(got).any(), "the kernel left poisoned (or NaN) outputs"
    np.testing.assert_allclose(got, expect, rtol=3e-3, atol=3e-3)


SEGMENT_CASES = {
    # name: (n_head, n_kv_heads, hd, range slots R, [(range, first pos, tokens)] in batch order, window)
    "qwen3_four": (16, 8, 128, 320, [(2, 0, 37), (0, 5, 1), (3, 0, 64), (1, 200, 90)], 0),
    "moe_gqa8_short": (32, 4, 128, 64, [(1, 3, 3), (4, 0, 1), (2, 10, 2), (3, 0, 7), (5, 60, 1), (0, 0, 9)], 0),
    "gemma_hd256_window": (4, 1, 256, 800, [(1, 600, 45), (0, 0, 130)], 512),
    "hd64_mha_window_8": (6, 6, 64, 96, [(2, 20, 33), (1, 0, 17), (3, 50, 40)], 8),
}


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("case", list(SEGMENT_CASES))
def test_flash_attention_over_several_sequences(gpu, case, paged):
    """Prompt chunks of several sequences in one launch (gpu/batch.py packs them): each token at
    an absolute slot of its sequence's range, seeing that range from seg_lo (no shared prefix).
    Chunks continue earlier tokens of their sequence (already in the cache), 1-token chunks and
    blocks of 64 / G tokens straddle sequences, ranges come in any order. Every slot no token may
    see (the gaps between ranges, a range past its last token) holds NaN: the kernel must neither
    read it into a product nor let 0 * NaN through; numpy gets them as zeros. Paged: the same
    through a block table, the blocks scattered over a pool twice as large (NaN elsewhere)."""
    _sm80(gpu)
    from reflex_runtime.kvpool import KV_BLOCK

    n_head, n_kvh, hd, R, segs, window = SEGMENT_CASES[case]
    rng = np.random.default_rng(list(case.encode()))
    n_ctx = R * (1 + max(r for r, _, _ in segs))
    kc, vc, _, _, _ = _prompt_problem(rng, n_head, n_kvh, hd, 0, 0, n_ctx)
    kv_pos = np.full(n_ctx, 10**6, np.int32)  # unwritten slots: positions no window reaches
    seen = np.zeros(n_ctx, bool)
    q_pos, q_slot, seg_lo = [], [], []
    for rg, p0, n in segs:
        base = rg * R
        q_pos += range(p0, p0 + n)
        q_slot += range(base + p0, base + p0 + n)
        seg_lo += [base] * n
        seen[base:base + p0 + n] = True
        kv_pos[base:base + p0 + n] = np.arange(p0 + n)
    q_pos, q_slot, seg_lo = (np.array(a, np.int32) for a in (q_pos, q_slot, seg_lo))
    n_tok = len(q_pos)
    q = rng.standard_normal((n_tok, n_head, hd)).astype(np.float32)
    kc[:, ~seen], vc[:, ~seen] = np.nan, np.nan
    scale = 1.0 / np.sqrt(hd)
    expect = _attention_ref_fast(q, np.nan_to_num(kc), np.nan_to_num(vc), kv_pos, q_pos, q_slot, seg_lo, 0, n_ctx,
                                 window, scale, 0.0)
    k_dev, v_dev, rows, blocks = kc, vc, n_ctx, 0
    if paged:
        nb = n_ctx // KV_BLOCK
        assert n_ctx % KV_BLOCK == 0
        perm = rng.permutation(2 * nb)[:nb]
        k_dev = np.full((n_kvh, 2 * nb * KV_BLOCK, hd), np.nan, np.float16)
        v_dev = k_dev.copy()
        for i, b in enumerate(perm):
            k_dev[:, b * KV_BLOCK:(b + 1) * KV_BLOCK] = kc[:, i * KV_BLOCK:(i + 1) * KV_BLOCK]
            v_dev[:, b * KV_BLOCK:(b + 1) * KV_BLOCK] = vc[:, i * KV_BLOCK:(i + 1) * KV_BLOCK]
        rows, blocks = 2 * nb * KV_BLOCK, gpu.put(perm.astype(np.int32))
    out = gpu.poisoned((n_tok, n_head, hd))
    assert flash_attn.ok(gpu.launch, n_tok, hd, hd, n_head, n_kvh)
    flash_attn.attention(gpu.launch, gpu.put(q), gpu.put(k_dev), gpu.put(v_dev), gpu.put(kv_pos), gpu.put(q_pos),
                         gpu.put(q_slot), gpu.put(seg_lo), 0, gpu.put(np.array([n_ctx], np.int32)), out, n_tok,
                         n_head, n_kvh, hd, rows, window, scale, 0.0, blocks=blocks)
    got = gpu.get(out, (n_tok, n_head, hd))
    assert not np.isnan(got).any(), "a NaN slot reached the output (or the output was left poisoned)"
    np.testing.assert_allclose(got, expect, rtol=3e-3, atol=3e-3)


def test_prompt_attention_path_choice(gpu):
    """Blocks ask flash_ok: prompts of the head sizes flash_attn.cu has go to it on sm_80+; a
    single decode token, other head sizes, and older GPUs keep reflex_attn."""
    L = gpu.launch
    sm80 = tuple(gpu.dev.cc) >= (8, 0)
    assert flash_attn.ok(L, 512, 128, 128, 16, 8) == sm80
    assert flash_attn.ok(L, 2, 256, 256, 4, 1) == sm80
    assert not flash_attn.ok(L, 1, 128, 128, 16, 8)
    assert not flash_attn.ok(L, 512, 96, 96, 6, 3)
    assert not flash_attn.ok(L, 512, 128, 64, 16, 8)


def _state(gpu, n, last_pos, last_slot):
    """Device decode state with the last token of a pass at index n-1."""

    bufs = {
        "tokens": gpu.put(np.full(n, -5, np.int32)), "pos": gpu.put(np.full(n, last_pos, np.int32)),
        "slot": gpu.put(np.full(n, last_slot, np.int32)), "n_kv": gpu.put(np.zeros(1, np.int32)),
        "step": gpu.put(np.array([3], np.int32)), "out_tokens": gpu.put(np.full(8, -1, np.int32)),
    }
    return RxState(*[bufs[k] for k in ("tokens", "pos", "slot", "n_kv", "step", "out_tokens")]), bufs


def _check_advanced(gpu, bufs, tok, last_pos, last_slot):
    assert gpu.get(bufs["tokens"], (1,), np.int32)[0] == tok
    assert gpu.get(bufs["out_tokens"], (8,), np.int32)[3] == tok
    assert gpu.get(bufs["step"], (1,), np.int32)[0] == 4
    assert gpu.get(bufs["pos"], (1,), np.int32)[0] == last_pos + 1
    assert gpu.get(bufs["slot"], (1,), np.int32)[0] == last_slot + 1
    assert gpu.get(bufs["n_kv"], (1,), np.int32)[0] == last_slot + 2


@pytest.mark.parametrize("vocab", [151936, 262144, 1000])
def test_argmax_ties_nan_and_state(gpu, vocab):
    rng = np.random.default_rng(vocab)
    logits = rng.standard_normal(vocab).astype(np.float32)
    hi = logits.max() + 1.0
    a, b = sorted(rng.choice(vocab, 2, replace=False))
    logits[b] = hi
    logits[a] = hi  # a tie: the lower id must win
    logits[rng.integers(vocab)] = np.nan
    st, bufs = _state(gpu, 4, 41, 44)
    sample_ops.argmax(gpu.launch, gpu.put(logits), vocab, gpu.poisoned((ARGMAX_PARTS,)),
                  gpu.poisoned((ARGMAX_PARTS,), np.int32), ARGMAX_PARTS, st, 3)
    _check_advanced(gpu, bufs, int(a), 41, 44)


SAMPLE_CASES = [
    dict(temperature=0.7), dict(temperature=1.0, top_k=40), dict(temperature=1.3, top_p=0.9),
    dict(temperature=0.8, min_p=0.05), dict(temperature=1.0, top_k=50, top_p=0.95, min_p=0.02),
    dict(temperature=2.0, top_k=7),
]


@pytest.mark.parametrize("case", range(len(SAMPLE_CASES)))
def test_sampler_matches_reference(gpu, case):
    from reflex_runtime.reference.sampling import sample
    from reflex_runtime.sampling import SamplingParams

    vocab = 151936
    rng = np.random.default_rng(case)
    logits = (rng.standard_normal(vocab) * 3).astype(np.float32)
    logits[:20] = logits[20:40]  # ties everywhere near the top
    logits[rng.choice(vocab, 5)] = logits.max()
    d_logits = gpu.put(logits)
    agree = 0
    for trial in range(24):
        seed = int(rng.integers(0, 2**63))
        params = SamplingParams(seed=seed, **SAMPLE_CASES[case])
        sp = RxSampling(params.temperature, params.top_k, params.top_p, params.min_p, seed)
        d_sp = gpu.put(np.frombuffer(bytes(sp), dtype=np.uint8))
        st, bufs = _state(gpu, 1, 9, 9)
        sample_ops.sample(gpu.launch, d_logits, vocab, d_sp, st, 0)
        got = int(gpu.get(bufs["tokens"], (1,), np.int32)[0])
        expect = sample(logits, params, 3)  # the kernel reads step 3 from the state
        agree += got == expect
        _check_advanced(gpu, bufs, got, 9, 9)
    # float sums in a different order may flip a draw that lands within ~1e-7 of a boundary
    assert agree >= 23, f"{agree}/24 draws equal the reference"


def test_logprob_rows(gpu):
    rng = np.random.default_rng(5)
    rows, vocab = 7, 151936
    logits = (rng.standard_normal((rows, vocab)) * 4).astype(np.float32)
    pick = np.array([6, 0, 3, 3], np.int32)
    toks = rng.integers(0, vocab, size=4).astype(np.int32)
    out = gpu.poisoned((4,))
    logit_ops.logprob_rows(gpu.launch, gpu.put(logits), vocab, gpu.put(pick), gpu.put(toks), out, 4)
    x = logits.astype(np.float64)
    lse = np.log(np.exp(x - x.max(1, keepdims=True)).sum(1)) + x.max(1)
    np.testing.assert_allclose(gpu.get(out, (4,)), x[pick, toks] - lse[pick], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("aligned", [True, False])
def test_scatter_pieces_put_each_piece_in_place(gpu, aligned):
    """kernels/scatter.cu against numpy: a pack of pieces of awkward sizes (1 byte to past a
    slice boundary) copied to scattered places in a destination poisoned with 0xA5, 16-byte
    aligned places or odd ones; every byte outside the pieces keeps its poison."""
    from reflex_runtime.gpu.ops import scatter

    rng = np.random.default_rng([7, aligned])
    sizes = [1, 15, 16, 17, 4095, 65537, 600_003, 32, 1_048_576 + 48]
    dst_len = 4 << 20
    dst = gpu.put(np.full(dst_len, 0xA5, np.uint8))
    want = np.full(dst_len, 0xA5, np.uint8)
    pack = np.zeros(scatter.pack_bytes(sizes), np.uint8)
    at, rows, place = scatter.header_bytes(len(sizes)), [], 64 + (0 if aligned else 3)
    for n in sizes:
        piece = rng.integers(0, 256, n, dtype=np.uint8)
        pack[at:at + n] = piece
        want[place:place + n] = piece
        rows.append((dst + place, at, n))
        at += scatter.aligned(n)
        place += n + (16 - n % 16) % 16 + 32 + (0 if aligned else 5)  # gaps between places: left alone
    assert place < dst_len
    scatter.write_header(memoryview(pack), rows)
    scatter.scatter(gpu.launch, gpu.put(pack), len(sizes))
    got = gpu.get(dst, (dst_len,), np.uint8)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{bad.size} bytes differ, the first at {bad[:1]}"


def test_smoke_known_answers(gpu):
    from reflex_runtime.gpu.smoke import known_answers

    assert known_answers(gpu.dev, gpu.stream) == []


def test_every_table_kernel_resolves(gpu):
    from reflex_runtime.gpu.ops import kernel_names

    assert gpu.dev.resolve_all(kernel_names()) == []
    assert ctypes.sizeof(ctypes.c_long) == 8  # kernels take `long` row strides


# -- one-token (decode) kernels: weights staged in shared memory (kernels/mvs.cu, attn_decode.cu) --

@pytest.fixture
def knobs(gpu):
    """The launcher's decode-kernel settings, restored after the test."""
    L = gpu.launch
    saved = dict(staged=L.staged, attn_decode=L.attn_decode, mvs_budget=L.mvs_budget,
                 mvs_blocks_per_sm=L.mvs_blocks_per_sm, attn_min_keys=L.attn_min_keys,
                 attn_blocks_per_sm=L.attn_blocks_per_sm, fuse_rope=L.fuse_rope, attn_head_groups=L.attn_head_groups,
                 mvs_head_stream=L.mvs_head_stream, post_fold=L.post_fold, attn_tc=L.attn_tc,
                 attn_tc_min_keys=L.attn_tc_min_keys, attn_group_kernels=L.attn_group_kernels)
    yield L
    for k, v in saved.items():
        setattr(L, k, v)


def _kernels(gpu, fn):
    """Run fn with the launches recorded; the kernel names it launched."""
    with gpu.launch.record() as rec:
        fn()
    return [ln.kernel.name for ln in rec]


# (rows, k): awkward sizes, one warp per row (k <= 1024) and 2, 4 and 8 warps per row
MVS_SHAPES = [(1, None), (37, None), (1000, None), (301, 2048), (130, 3072), (67, 8192)]


@pytest.mark.parametrize("qtype", list(TYPE_NAMES), ids=lambda t: t.name)
@pytest.mark.parametrize("rows,k", MVS_SHAPES)
@pytest.mark.parametrize("fused_norm", [False, True])
def test_staged_matvec_one_token(gpu, knobs, qtype, rows, k, fused_norm):
    rng = np.random.default_rng([int(qtype), rows, k or 0, fused_norm])
    k = k or k_for(qtype, False)
    w, dense = weight(gpu, qtype, rows, k, rng)
    x = (rng.standard_normal((1, k)) * 2).astype(np.float32)
    nw = (rng.random(k) + 0.5).astype(np.float32)
    xe = _rms(x, nw, 1e-6).astype(np.float32) if fused_norm else x
    base = rng.standard_normal((1, rows)).astype(np.float32)
    for accumulate in (False, True):
        y = gpu.put(base) if accumulate else gpu.poisoned((1, rows))
        names = _kernels(gpu, lambda: products.matmul(gpu.launch, w, gpu.put(x), y, 1, accumulate=accumulate,
                                                      norm_w=gpu.put(nw) if fused_norm else 0, eps=1e-6))
        assert names == [f"reflex_mvs_{w.suffix}"]
        assert_matmul_close(gpu.get(y, (1, rows)), xe, dense, base if accumulate else None, rtol=2e-4)


@pytest.mark.parametrize("qtype", [Q.F16, Q.Q8_0, Q.Q4_0, Q.Q4_K, Q.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("blocks_per_sm,budget_rows", [(1, 3), (2, 1), (4, 1000)])
def test_staged_matvec_segments_any_split(gpu, knobs, qtype, blocks_per_sm, budget_rows):
    """q, k and v in one launch with blocks of 1, 3 or many rows (waves of blocks, segment tails)."""
    rng = np.random.default_rng([int(qtype), blocks_per_sm, budget_rows])
    k = k_for(qtype, False)
    mats = [weight(gpu, qtype, rows, k, rng) for rows in (515, 96, 33)]
    knobs.mvs_blocks_per_sm = blocks_per_sm
    knobs.mvs_budget = budget_rows * mats[0][0].row_bytes + 64
    x = (rng.standard_normal((1, k)) * 3).astype(np.float32)
    nw = (rng.random(k) + 0.5).astype(np.float32)
    ys = [gpu.poisoned((1, w.rows)) for w, _ in mats]
    names = _kernels(gpu, lambda: products.segments(gpu.launch, [w for w, _ in mats], gpu.put(x), ys, 1,
                                                    norm_w=gpu.put(nw), eps=1e-6))
    assert names == [f"reflex_mvs_{mats[0][0].suffix}"]
    xn = _rms(x, nw, 1e-6).astype(np.float32)
    for (w, dense), y in zip(mats, ys):
        assert_matmul_close(gpu.get(y, (1, w.rows)), xn, dense, rtol=2e-4)


@pytest.mark.parametrize("types", [(Q.Q8_0,) * 3, (Q.Q4_K, Q.Q4_K, Q.Q6_K), (Q.F16,) * 3],
                         ids=lambda ts: "-".join(t.name for t in ts))
@pytest.mark.parametrize("k", [768, 2304])  # one float4 a thread at most, and more (mvs_post_x's second loads)
def test_post_norm_folded_into_segments_and_glu(gpu, knobs, types, k):
    """Gemma's post-norm folded into the next one-token launch (mvs.Post): the launch's input is
    r + norm(src) * w, normalized again with its own pre-norm weights, and block (0, 0) leaves that
    residual in x_out; q/k/v of one type (reflex_mvs_*) or mixed (reflex_mvs_mixed), and gate/up."""
    rng = np.random.default_rng([int(t) for t in types] + [k])
    knobs.post_fold = True
    mats = [weight(gpu, t, rows, k, rng) for t, rows in zip(types, (389, 64, 64))]
    r = (rng.standard_normal((1, k)) * 2).astype(np.float32)
    src = (rng.standard_normal((1, k)) * 30).astype(np.float32)  # a block's raw output: any scale
    pw = (rng.random(k) + 0.5).astype(np.float32)
    nw = (rng.random(k) + 0.5).astype(np.float32)
    eps = 1e-6
    x_new = r.astype(np.float64) + _rms(src, pw, eps)
    xn = _rms(x_new.astype(np.float32), nw, eps).astype(np.float32)
    assert mvs.folds_post(gpu.launch, [w for w, _ in mats])
    x_out = gpu.poisoned((1, k))
    post = mvs.Post(gpu.put(src), gpu.put(pw), x_out, eps)
    ys = [gpu.poisoned((1, w.rows)) for w, _ in mats]
    names = _kernels(gpu, lambda: products.matmul_many(gpu.launch, [w for w, _ in mats], gpu.put(r), ys, 1,
                                                       norm_w=gpu.put(nw), eps=eps, post=post))
    assert names == ["reflex_mvs_mixed_post" if len(set(types)) > 1 else f"reflex_mvs_post_{mats[0][0].suffix}"]
    np.testing.assert_allclose(gpu.get(x_out, (1, k)), x_new, rtol=2e-5, atol=2e-5 * np.abs(x_new).max())
    for (w, dense), y in zip(mats, ys):
        assert_matmul_close(gpu.get(y, (1, w.rows)), xn, dense, rtol=2e-4)
    # gate/up of the first type, 333 rows
    (wg, dg), (wu, du) = (weight(gpu, types[0], 333, k, rng) for _ in range(2))
    assert mvs.folds_post(gpu.launch, [wg, wu], ranges=2)
    x_out2, out = gpu.poisoned((1, k)), gpu.poisoned((1, 333))
    names = _kernels(gpu, lambda: products.gated_ffn_in(gpu.launch, wg, wu, gpu.put(r), out, 1, 1, 0, 0,
                                                        norm_w=gpu.put(nw), eps=eps,
                                                        post=mvs.Post(post.src, post.w, x_out2, eps)))
    assert names == [f"reflex_mvs_glu_post_{wg.suffix}"]
    np.testing.assert_allclose(gpu.get(x_out2, (1, k)), x_new, rtol=2e-5, atol=2e-5 * np.abs(x_new).max())
    g, u = xn.astype(np.float64) @ dg.T, xn.astype(np.float64) @ du.T
    expect = _act(g, 1) * u
    tol = 6e-4 * (np.abs(xn) @ np.abs(dg).T) * (np.abs(xn) @ np.abs(du).T) + 1e-5
    got = gpu.get(out, (1, 333))
    assert not np.isnan(got).any() and (np.abs(got - expect) <= tol).all(), np.abs(got - expect).max()


def test_staged_matvec_legacy_switch(gpu, knobs):
    """With staged off (the bench's comparison), one token takes the legacy kernel again."""
    rng = np.random.default_rng(11)
    w, dense = weight(gpu, Q.Q8_0, 64, 512, rng)
    x = rng.standard_normal((1, 512)).astype(np.float32)
    knobs.staged = False
    y = gpu.poisoned((1, 64))
    assert _kernels(gpu, lambda: products.matmul(gpu.launch, w, gpu.put(x), y, 1)) == ["reflex_mv_q8_0"]
    assert_matmul_close(gpu.get(y, (1, 64)), x, dense)


@pytest.mark.parametrize("qtype", list(TYPE_NAMES), ids=lambda t: t.name)
@pytest.mark.parametrize("act,fused_norm,k", [(0, True, None), (1, False, None), (0, True, 3072)])
def test_staged_glu_one_token(gpu, knobs, qtype, act, fused_norm, k):
    rng = np.random.default_rng([int(qtype), act, fused_norm, k or 0])
    k, rows = k or k_for(qtype, False), 333
    wg, dg = weight(gpu, qtype, rows, k, rng)
    wu, du = weight(gpu, qtype, rows, k, rng)
    x_in = (rng.standard_normal((1, k)) * 0.5).astype(np.float32)
    nw = (rng.random(k) + 0.5).astype(np.float32)
    x = _rms(x_in, nw, 1e-6).astype(np.float32) if fused_norm else x_in
    out = gpu.poisoned((1, rows))
    names = _kernels(gpu, lambda: products.gated_ffn_in(gpu.launch, wg, wu, gpu.put(x_in), out, 1, act, 0, 0,
                                                        norm_w=gpu.put(nw) if fused_norm else 0, eps=1e-6))
    assert names == [f"reflex_mvs_glu_{wg.suffix}"]
    got = gpu.get(out, (1, rows))
    g, u = x.astype(np.float64) @ dg.T, x.astype(np.float64) @ du.T
    with np.errstate(over="ignore"):
        expect = _act(g, act) * u
    tol = 6e-4 * (np.abs(x) @ np.abs(dg).T) * (np.abs(x) @ np.abs(du).T) + 1e-5
    assert not np.isnan(got).any()
    assert (np.abs(got - expect) <= tol).all(), np.abs(got - expect).max()


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_K, Q.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("stream", [0, 1, 2])
def test_staged_lm_head_with_fused_argmax(gpu, knobs, qtype, stream):
    """Logits of 20011 rows in blocks of 61 rows, the greedy pick fused: a tie between two copies of
    the best row goes to the lower id (across blocks), a NaN row never wins, and the last block
    leaves its counter at zero for the next replay. stream 1 / 2: the streamed head, 1 or 2
    resident blocks an SM walking their rows (152 or 76 a block on 132 SMs) in chunks of 15."""
    from quant_blocks import random_matrix

    from reflex_runtime.gpu.ops.common import Weight

    rng = np.random.default_rng(int(qtype))
    rows, k = 20011, 256
    raw, dense = random_matrix(qtype, rows, k, rng)
    rb_bytes = raw.nbytes // rows
    raw = raw.reshape(rows, rb_bytes)
    x = rng.standard_normal((1, k)).astype(np.float32)
    nw = (rng.random(k) + 0.5).astype(np.float32)
    xn = _rms(x, nw, 1e-6).astype(np.float32)
    best = int(np.argmax(xn.astype(np.float64) @ dense.T.astype(np.float64)))
    lo, hi = sorted(rng.choice([r for r in range(rows) if abs(r - best) > 200], 2, replace=False))
    raw[lo], raw[hi], dense[lo], dense[hi] = raw[best], raw[best], dense[best], dense[best]
    nan_row = int(rng.choice([r for r in range(rows) if r not in (lo, hi, best)]))
    if qtype == Q.F32:  # a NaN logit must never be picked
        raw[nan_row] = np.full(k, np.nan, np.float32).view(np.uint8)
    w = Weight(gpu.put(raw), TYPE_NAMES[qtype], rows, k, rb_bytes)
    knobs.mvs_budget = 61 * rb_bytes + 64
    knobs.mvs_head_stream = stream
    logits = gpu.poisoned((1, rows))
    part_v, part_i = gpu.poisoned((rows,)), gpu.poisoned((rows,), np.int32)
    counter = gpu.put(np.zeros(1, np.int32))
    expect = xn.astype(np.float64) @ dense.T.astype(np.float64)
    if qtype == Q.F32:
        expect[0, nan_row] = np.nan
    for replay in range(2):
        st, bufs = _state(gpu, 1, 9, 9)
        names = _kernels(gpu, lambda: mvs.head(gpu.launch, w, gpu.put(x), logits, gpu.put(nw), 1e-6,
                                               (part_v, part_i, counter, st, 0)))
        assert names == [f"reflex_mvs_{'head_' if stream else ''}{w.suffix}"]
        got = gpu.get(logits, (1, rows))
        ok = ~np.isnan(expect)
        assert np.isnan(got[~ok]).all() and not np.isnan(got[ok]).any()
        bound = 2e-4 * (np.abs(xn) @ np.abs(np.nan_to_num(dense)).T) + 1e-5
        assert (np.abs(got - expect)[ok] <= bound[ok]).all()
        assert got[0, lo] == got[0, hi] == got[0, best]
        _check_advanced(gpu, bufs, int(min(lo, best)), 9, 9)
        assert gpu.get(counter, (1,), np.int32)[0] == 0


@pytest.mark.parametrize("qtype", [Q.F32, Q.Q8_0, Q.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("stream,k", [(0, 256), (2, 256), (2, 2304)])  # 2304: 3 warps a row in the streamed head
def test_staged_lm_head_without_pick_writes_logits_only(gpu, knobs, qtype, stream, k):
    knobs.mvs_head_stream = stream
    rng = np.random.default_rng([int(qtype) + 100, k])
    w, dense = weight(gpu, qtype, 4099, k, rng)
    x = rng.standard_normal((1, k)).astype(np.float32)
    y = gpu.poisoned((1, 4099))
    names = _kernels(gpu, lambda: mvs.head(gpu.launch, w, gpu.put(x), y, 0, 0.0))
    assert names == [f"reflex_mvs_{'head_' if stream else ''}{w.suffix}"]
    assert_matmul_close(gpu.get(y, (1, 4099)), x, dense, rtol=2e-4)


@pytest.mark.parametrize("qtype", [Q.F16, Q.Q8_0, Q.Q4_K, Q.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_staged_products_keep_a_non_finite_input_visible(gpu, qtype, bad):
    """The integer dots quantize x per 32 inputs: a NaN or infinite input must still make every
    output non-finite (as float products would), never a finite number from a saturated code."""
    rng = np.random.default_rng(int(qtype))
    w, dense = weight(gpu, qtype, 300, 768, rng)
    x = rng.standard_normal((1, 768)).astype(np.float32)
    x[0, 517] = bad
    y = gpu.poisoned((1, 300))
    assert mvs.head(gpu.launch, w, gpu.put(x), y, 0, 0.0)
    assert not np.isfinite(gpu.get(y, (1, 300))).any()


DECODE_ATTN_CASES = {
    # name: (n_head, n_kv_heads, hd, n_vis, window, softcap, min_keys, prefetch)
    "qwen3_0.6b_ctx256": (16, 8, 128, 256, 0, 0.0, 32, True),
    "qwen3_ctx1": (16, 8, 128, 1, 0, 0.0, 32, False),
    "qwen3_ctx33_one_slice": (16, 8, 128, 33, 0, 0.0, 64, True),
    "qwen3_ctx5000": (16, 8, 128, 5000, 0, 0.0, 32, True),  # 66 slices: runs of 16, 16, 16, 16, 2
    "moe_gqa8_ctx1500": (32, 4, 128, 1500, 0, 0.0, 16, False),
    "moe_gqa8_ctx9000_128_slices": (32, 4, 128, 9000, 0, 0.0, 32, True),  # the slice cap; 2 merge items a thread
    "moe_gqa8_empty_runs": (32, 4, 128, 130, 0, 0.0, 1, False),  # 128 slices of 2 keys: slices 65-127 empty
    "gqa16_hd32_ctx5000_128_slices": (16, 1, 32, 5000, 0, 0.0, 32, False),  # merge weights fill the V tiles' 8 KB
    "gemma_hd256_window": (4, 1, 256, 700, 512, 0.0, 32, True),
    "gemma_window_longer_than_context": (4, 1, 256, 300, 512, 0.0, 32, False),
    "gqa16_hd32_softcap": (16, 1, 32, 333, 0, 30.0, 7, True),
    "mha_hd64_odd_keys": (6, 6, 64, 77, 20, 0.0, 1, False),
    "hd96_one_key_per_slice": (6, 3, 96, 50, 0, 0.0, 1, True),
    # short contexts (one tile, two), values narrower or wider than keys
    "short_qwen3_ctx2": (16, 8, 128, 2, 0, 0.0, 32, True),
    "short_qwen3_ctx32": (16, 8, 128, 32, 0, 0.0, 32, False),
    "short_smollm_hd64_g3_ctx64": (9, 3, 64, 64, 0, 0.0, 32, True),
    "short_gemma_hd256_window_ctx63": (4, 1, 256, 63, 20, 0.0, 32, True),
    "short_gqa16_hd32_softcap_ctx41": (16, 1, 32, 41, 0, 30.0, 7, True),  # 4 heads a warp
    "short_qwen3_ctx65": (16, 8, 128, 65, 0, 0.0, 32, True),
    "short_hd128_values64": (8, 2, 128, 37, 0, 0.0, 32, True),
    "short_hd64_values128": (8, 2, 64, 64, 0, 0.0, 32, False),
    "hd64_values128_ctx300": (8, 2, 64, 300, 0, 0.0, 32, True),
    # long slices: many tiles a block (the running max and sum)
    "long_slices_ctx600": (16, 8, 128, 600, 0, 0.0, 256, True),
    "long_slices_window_hd64": (8, 4, 64, 500, 100, 0.0, 256, False),
    "hd32_g2_ctx200": (4, 2, 32, 200, 0, 0.0, 16, True),
    "gqa8_hd32_ctx300": (8, 1, 32, 300, 0, 0.0, 64, True),  # the tensor-core kernels' fullest scratch for the tiles' room
    "softcap_g4_hd64_ctx150": (8, 2, 64, 150, 0, 30.0, 16, True),
}
DECODE_ATTN_HD_V = {"short_hd128_values64": 64, "short_hd64_values128": 128, "hd64_values128_ctx300": 128}


def _decode_attn_inputs(case, salt=()):
    """DECODE_ATTN_CASES[case]'s random inputs (one decode token whose slot is the last visible one,
    kv_pos = slot + 3) and its float64 reference: hd_v, n_ctx, (q, k cache, v cache, kv_pos, q_slot),
    scale, expected output."""
    n_head, n_kvh, hd, n_vis, window, softcap, _, _ = DECODE_ATTN_CASES[case]
    hd_v = DECODE_ATTN_HD_V.get(case, hd)  # values as wide as keys, or not
    rng = np.random.default_rng(list(case.encode()) + list(salt))
    n_ctx = n_vis + 37
    kc = rng.standard_normal((n_kvh, n_ctx, hd)).astype(np.float16)
    vc = rng.standard_normal((n_kvh, n_ctx, hd_v)).astype(np.float16)
    q = (rng.standard_normal((1, n_head, hd)) * 2).astype(np.float32)
    kv_pos = np.arange(n_ctx, dtype=np.int32) + 3
    q_slot = np.array([n_vis - 1], np.int32)
    scale = 1.0 / np.sqrt(hd)
    expect = _attention_ref(q, kc, vc, kv_pos, kv_pos[q_slot], q_slot, None, 0, n_vis, window, scale, softcap)
    return hd_v, n_ctx, (q, kc, vc, kv_pos, q_slot), scale, expect


@pytest.mark.parametrize("case", list(DECODE_ATTN_CASES))
@pytest.mark.parametrize("head_groups", [1, 4])
def test_attention_decode(gpu, knobs, case, head_groups):
    """head_groups 4: a KV head's query heads shared by up to 4 blocks while the slices leave room
    (short contexts; G = 2 takes 2, G = 1 one); past that the first block of each takes them all."""

    n_head, n_kvh, hd, n_vis, window, softcap, min_keys, prefetch = DECODE_ATTN_CASES[case]
    hd_v, n_ctx, (q, kc, vc, kv_pos, q_slot), scale, expect = _decode_attn_inputs(case)
    q_pos = kv_pos[q_slot]
    knobs.attn_min_keys = min_keys
    knobs.attn_head_groups = head_groups
    part_o = gpu.poisoned((n_head * attn_decode.SPLITS_MAX * hd_v,))
    part_ml = gpu.poisoned((n_head * attn_decode.SPLITS_MAX * 2,))
    counters = gpu.put(np.zeros(attn_decode.counters(n_head), np.int32))
    args = [gpu.put(q), gpu.put(kc), gpu.put(vc), gpu.put(kv_pos), gpu.put(q_pos), gpu.put(q_slot),
            gpu.put(np.array([n_vis], np.int32))]
    # the merge must leave its counters ready for the next replay; with a window, also walk only
    # the window's slots (kv_pos = slot + 3 here, as the flag promises)
    for replay, window_slots in enumerate([False, window > 0]):
        out = gpu.poisoned((1, n_head, hd_v))
        assert attn_decode.attention(gpu.launch, *args, out, part_o, part_ml, counters, n_head, n_kvh, hd, hd_v, n_ctx,
                                     window, scale, softcap, prefetch, window_slots)
        np.testing.assert_allclose(gpu.get(out, (1, n_head, hd_v)), expect, rtol=2e-4, atol=2e-4)
    assert not gpu.get(counters, (attn_decode.counters(n_head),), np.int32).any()


# one slice (written as the output), 2 .. 8 (left to the output projection), 10 and 13 (merged in the
# attention): G of 1, 2, 3 and 4, values narrower or wider than keys, a window, softcap
DEFER_CASES = ["short_qwen3_ctx2", "short_qwen3_ctx65", "qwen3_0.6b_ctx256", "short_smollm_hd64_g3_ctx64",
               "short_gemma_hd256_window_ctx63", "gemma_window_longer_than_context", "short_hd128_values64",
               "short_hd64_values128", "hd64_values128_ctx300", "hd32_g2_ctx200", "softcap_g4_hd64_ctx150"]


def _deferred_case(gpu, knobs, case, head_groups, defer=attn_decode.DEFER_MAX):
    """One decode attention launch of DECODE_ATTN_CASES[case] with `defer`: (the case's
    numbers, the reference output, the GPU buffers, the MvsMerge the output projection would take,
    the slices attn_plan.cuh makes)."""
    n_head, n_kvh, hd, n_vis, window, softcap, min_keys, prefetch = DECODE_ATTN_CASES[case]
    hd_v, n_ctx, (q, kc, vc, kv_pos, q_slot), scale, expect = _decode_attn_inputs(case, [7])
    knobs.attn_min_keys, knobs.attn_head_groups = min_keys, head_groups
    max_split, n_hg = attn_decode.grid_splits(gpu.launch, n_head, n_kvh, hd, hd_v)
    lo = max(0, n_vis - window) if window > 0 else 0  # window_slots: kv_pos = slot + 3
    n_split = min(max_split, max(1, -(-(n_vis - lo) // min_keys)))  # attn_plan.cuh atd_plan
    b = dict(part_o=gpu.poisoned((n_head * attn_decode.SPLITS_MAX * hd_v,)),
             part_ml=gpu.poisoned((n_head * attn_decode.SPLITS_MAX * 2,)),
             counters=gpu.put(np.zeros(attn_decode.counters(n_head), np.int32)), out=gpu.poisoned((1, n_head, hd_v)),
             n_kv=gpu.put(np.array([n_vis], np.int32)), slot=gpu.put(q_slot))
    assert attn_decode.attention(gpu.launch, gpu.put(q), gpu.put(kc), gpu.put(vc), gpu.put(kv_pos),
                                 gpu.put(kv_pos[q_slot]), b["slot"], b["n_kv"], b["out"], b["part_o"], b["part_ml"],
                                 b["counters"], n_head, n_kvh, hd, hd_v, n_ctx, window, scale, softcap, prefetch,
                                 window > 0, defer=defer)
    merge = mvs.MvsMerge(b["part_o"], b["part_ml"], b["n_kv"], b["slot"], max_split, min_keys, n_hg, window,
                         int(window > 0), hd_v, defer)
    return (n_head, hd_v, max_split), expect, b, merge, n_split


@pytest.mark.parametrize("case", DEFER_CASES)
@pytest.mark.parametrize("head_groups", [1, 4])
def test_attention_decode_leaves_a_few_slices_unmerged(gpu, knobs, case, head_groups):
    """With defer, a row of 2 .. defer slices writes only its partials (the output stays poisoned,
    no counter moves); merging them as split_merge does gives the attention. One slice, or more
    than defer, writes the output as before."""
    (n_head, hd_v, max_split), expect, b, _, n_split = _deferred_case(gpu, knobs, case, head_groups)
    out = gpu.get(b["out"], (1, n_head, hd_v))
    assert not gpu.get(b["counters"], (attn_decode.counters(n_head),), np.int32).any()
    if not 2 <= n_split <= attn_decode.DEFER_MAX:
        np.testing.assert_allclose(out, expect, rtol=2e-4, atol=2e-4)
        return
    assert np.isnan(out).all(), "a deferred row's output is the next kernel's to write"
    po = gpu.get(b["part_o"], (n_head, max_split, hd_v))[:, :n_split].astype(np.float64)  # the grid's slices apart
    ml = gpu.get(b["part_ml"], (n_head, max_split, 2))[:, :n_split].astype(np.float64)
    m, l = ml[..., 0], ml[..., 1]
    e = np.where(np.isneginf(m), 0.0, np.exp(m - m.max(axis=1, keepdims=True)))
    merged = (e[..., None] * po).sum(axis=1) / (e * l).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(merged[None], expect, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("case", DEFER_CASES)
@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_K], ids=lambda t: t.name)
def test_output_projection_merges_the_attention_slices(gpu, knobs, case, qtype):
    """reflex_mvs_merge_*: y = base + Wo att, where att is merged from the deferred slices in the
    launch (mvs.cuh mvs_merge_x) or read as the attention wrote it (one slice, more than defer);
    the same as the attention merging them itself (defer 0) within rounding."""
    (n_head, hd_v, _), expect, b, merge, n_split = _deferred_case(gpu, knobs, case, 4)
    k = n_head * hd_v
    if qtype == Q.Q4_K and k % 256:
        qtype = Q.Q8_0  # K-quant rows are whole 256-weight blocks
    rng = np.random.default_rng(list(case.encode()) + [int(qtype)])
    w, dense = weight(gpu, qtype, 333, k, rng)
    base = rng.standard_normal((1, 333)).astype(np.float32)
    assert mvs.takes_merge(gpu.launch, w, b["out"]) == (k <= knobs.attn_out_merge_k)  # the kernel serves any K
    y = gpu.put(base)
    names = _kernels(gpu, lambda: products.matmul(gpu.launch, w, b["out"], y, 1, accumulate=True, merge=merge))
    assert names == [f"reflex_mvs_merge_{w.suffix}"]
    got = gpu.get(y, (1, 333))
    assert_matmul_close(got, expect.reshape(1, k).astype(np.float32), dense, base, rtol=5e-4)
    # the attention merging its own slices (defer 0): the same kernel reads x as it was written
    _, _, b0, merge0, _ = _deferred_case(gpu, knobs, case, 4, defer=0)
    y0 = gpu.put(base)
    products.matmul(gpu.launch, w, b0["out"], y0, 1, accumulate=True, merge=merge0)
    np.testing.assert_allclose(got, gpu.get(y0, (1, 333)), rtol=1e-5, atol=1e-5 * np.abs(got).max())


def test_attention_decode_refuses_what_it_cannot_serve(gpu, knobs):
    """Head sizes off the 32 grid, or more than 16 query heads per KV head: the legacy kernel serves."""
    L = gpu.launch
    assert not attn_decode.attention(L, *([0] * 11), 4, 2, 48, 48, 64, 0, 1.0, 0.0, False)
    assert not attn_decode.attention(L, *([0] * 11), 32, 1, 64, 64, 64, 0, 1.0, 0.0, False)
    knobs.attn_decode = False
    assert not attn_decode.attention(L, *([0] * 11), 16, 8, 128, 128, 64, 0, 1.0, 0.0, False)


@pytest.mark.parametrize("types", [(Q.Q4_K, Q.Q4_K, Q.Q6_K), (Q.Q8_0, Q.F16, Q.Q5_0), (Q.F32, Q.Q6_K, Q.BF16)],
                         ids=lambda ts: "-".join(t.name for t in ts))
@pytest.mark.parametrize("accumulate", [False, True])
def test_staged_mixed_type_segments(gpu, knobs, types, accumulate):
    """q, k, v of different types (a Q4_K_M file's v is Q6_K) in one launch for one token."""
    rng = np.random.default_rng([int(t) for t in types] + [accumulate])
    k = 768  # a whole number of blocks for every type
    mats = [weight(gpu, t, rows, k, rng) for t, rows in zip(types, (257, 64, 33))]
    x = (rng.standard_normal((1, k)) * 3).astype(np.float32)
    nw = (rng.random(k) + 0.5).astype(np.float32)
    bases = [rng.standard_normal((1, w.rows)).astype(np.float32) for w, _ in mats]
    ys = [gpu.put(b) if accumulate else gpu.poisoned((1, w.rows)) for b, (w, _) in zip(bases, mats)]
    names = _kernels(gpu, lambda: products.segments(gpu.launch, [w for w, _ in mats], gpu.put(x), ys, 1, accumulate,
                                                    norm_w=gpu.put(nw), eps=1e-6))
    assert names == ["reflex_mvs_mixed"]
    xn = _rms(x, nw, 1e-6).astype(np.float32)
    for (w, dense), y, base in zip(mats, ys, bases):
        assert_matmul_close(gpu.get(y, (1, w.rows)), xn, dense, base if accumulate else None, rtol=2e-4)
    knobs.staged = False  # the legacy path: one launch per type
    ys = [gpu.poisoned((1, w.rows)) for w, _ in mats]
    names = _kernels(gpu, lambda: products.segments(gpu.launch, [w for w, _ in mats], gpu.put(x), ys, 1,
                                                    norm_w=gpu.put(nw), eps=1e-6))
    assert len(names) == 3 and all(n.startswith("reflex_mv_") for n in names)
    for (w, dense), y in zip(mats, ys):
        assert_matmul_close(gpu.get(y, (1, w.rows)), xn, dense, rtol=2e-4)


def _rope_modes(x, pos, rope_dim, base, mode, factors=None):
    """kernels/rope.cu's rotation (NeoX pairs (i, i + d/2), or pairwise (2i, 2i + 1) with mode 1),
    angle_i = pos * base^(-2i/d) / factors[i], in float64."""
    x = x.astype(np.float64).copy()
    half = rope_dim // 2
    ang = pos * base ** (-2.0 * np.arange(half) / rope_dim)
    if factors is not None:
        ang = ang / factors
    c, s = np.cos(ang), np.sin(ang)
    ia = np.arange(half) if mode == 0 else 2 * np.arange(half)
    ib = ia + half if mode == 0 else ia + 1
    a, b = x[..., ia].copy(), x[..., ib].copy()
    x[..., ia] = a * c - b * s
    x[..., ib] = a * s + b * c
    return x


FUSED_ROPE_CASES = {
    # name: (n_head, n_kvh, hd, rope_dim, n_vis, window, mode, factors, norms, prefetch, min_keys, splits)
    "qwen3_neox_norms": (16, 8, 128, 128, 300, 0, 0, False, True, True, 32, None),
    "partial_pairwise_factors": (8, 2, 128, 64, 77, 0, 1, True, False, False, 5, None),
    "gemma_window_hd256": (4, 1, 256, 256, 700, 512, 0, False, True, True, 32, None),
    "first_token": (4, 2, 64, 64, 1, 0, 0, False, True, True, 32, None),
    "empty_last_slice": (4, 1, 64, 64, 9, 0, 1, True, True, False, 1, 4),  # slices 3,3,3,0: the 3rd stores
    "far_position": (16, 8, 128, 128, 300, 0, 0, False, True, True, 32, None),  # positions from FAR_POSITION
    "new_key_in_second_tile": (8, 2, 128, 128, 50, 0, 0, False, True, True, 64, 1),  # one slice of 50 keys
    "new_key_in_eighth_tile": (16, 8, 128, 128, 2000, 0, 0, False, True, True, 32, 8),  # slices of 250 keys
    # short contexts: one tile, partial rotary, a window inside it
    "short_neox_norms_ctx5": (16, 8, 128, 128, 5, 0, 0, False, True, True, 32, None),
    "short_pairwise_partial_factors_ctx40": (8, 2, 128, 64, 40, 0, 1, True, False, False, 5, None),
    "short_neox_partial_ctx17": (8, 4, 128, 64, 17, 0, 0, False, True, False, 32, None),
    "short_gemma_window_hd256_ctx64": (4, 1, 256, 256, 64, 20, 0, False, True, True, 32, None),
    "short_smollm_hd64_g3_ctx30": (9, 3, 64, 64, 30, 0, 0, True, False, True, 32, None),
    "short_neox_rope96": (4, 2, 128, 96, 10, 0, 0, False, True, True, 32, None),
}
FAR_POSITION = {"far_position": 250_000}  # angles of ~40,000 turns: the kernel's reduction to [-pi, pi]


@pytest.mark.parametrize("case", list(FUSED_ROPE_CASES))
@pytest.mark.parametrize("head_groups", [1, 2])
def test_attention_decode_with_fused_rope_and_store(gpu, knobs, case, head_groups):
    """The decode attention doing reflex_qk_rope_store's work for one token: q and the new key
    normalized and rotated (NeoX or pairwise, frequency factors, partial rotary), the new key and
    value stored as f16 at the token's slot (and its position in kv_pos), then attention over the
    cache with them. head_groups 2: every block sharing the KV head makes the new key, one stores it."""
    from reflex_runtime.gpu.ops.attn_decode import AtdRope

    n_head, n_kvh, hd, rope_dim, n_vis, window, mode, use_factors, norms, prefetch, min_keys, splits = \
        FUSED_ROPE_CASES[case]
    rng = np.random.default_rng(list(case.encode()))
    n_ctx, eps, base = n_vis + 21, 1e-6, 10000.0
    slot = n_vis - 1
    kc = rng.standard_normal((n_kvh, n_ctx, hd)).astype(np.float16)
    vc = rng.standard_normal((n_kvh, n_ctx, hd)).astype(np.float16)
    first = 5 + FAR_POSITION.get(case, 0)
    kv_pos = (np.arange(n_ctx) + first).astype(np.int32)
    kv_pos[slot] = -1  # the kernel must write it
    pos = slot + first
    q = (rng.standard_normal((n_head, hd)) * 2).astype(np.float32)
    k_raw = (rng.standard_normal((n_kvh, hd)) * 2).astype(np.float32)
    v_raw = rng.standard_normal((n_kvh, hd)).astype(np.float32)
    qn, kn = (rng.random(hd) + 0.5).astype(np.float32), (rng.random(hd) + 0.5).astype(np.float32)
    factors = (rng.random(rope_dim // 2) * 3 + 0.5).astype(np.float32) if use_factors else None
    knobs.attn_min_keys = min_keys
    knobs.attn_head_groups = head_groups
    if splits:
        knobs.attn_blocks_per_sm = splits * n_kvh / gpu.dev.sm_count
        assert attn_decode.splits(gpu.launch, n_kvh) == splits
    d_kc, d_vc, d_kv_pos = gpu.put(kc), gpu.put(vc), gpu.put(kv_pos)
    rope = AtdRope(gpu.put(k_raw), gpu.put(v_raw), gpu.put(qn) if norms else None, gpu.put(kn) if norms else None,
                   gpu.put(factors) if use_factors else None, eps, base, 1.0, rope_dim, mode,
                   gpu.put(np.array(attn_decode.rope_theta(base, 1.0, rope_dim))))
    scale = 1.0 / np.sqrt(hd)
    out = gpu.poisoned((1, n_head, hd))
    counters = gpu.put(np.zeros(attn_decode.counters(n_head), np.int32))
    assert attn_decode.attention(
        gpu.launch, gpu.put(q), d_kc, d_vc, d_kv_pos, gpu.put(np.array([pos], np.int32)),
        gpu.put(np.array([slot], np.int32)), gpu.put(np.array([n_vis], np.int32)), out,
        gpu.poisoned((n_head * attn_decode.SPLITS_MAX * hd,)), gpu.poisoned((n_head * attn_decode.SPLITS_MAX * 2,)),
        counters, n_head, n_kvh, hd, hd, n_ctx, window, scale, 0.0, prefetch, window > 0, rope)
    # the stored key and value, and kv_pos
    ke = _rms(k_raw, kn, eps) if norms else k_raw.astype(np.float64)
    ke = _rope_modes(ke, pos, rope_dim, base, mode, factors)
    kc_after = gpu.get(d_kc, kc.shape, np.float16)
    vc_after = gpu.get(d_vc, vc.shape, np.float16)
    np.testing.assert_allclose(kc_after[:, slot].astype(np.float32), ke, rtol=2e-3, atol=2e-3)
    assert (vc_after[:, slot] == v_raw.astype(np.float16)).all()
    others = np.arange(n_ctx) != slot
    assert (kc_after[:, others] == kc[:, others]).all() and (vc_after[:, others] == vc[:, others]).all()
    kv_pos_after = gpu.get(d_kv_pos, (n_ctx,), np.int32)
    assert kv_pos_after[slot] == pos
    # attention with the rotated q over the cache as the kernel left it
    qe = _rms(q, qn, eps) if norms else q.astype(np.float64)
    qe = _rope_modes(qe, pos, rope_dim, base, mode, factors)[None]
    expect = _attention_ref(qe, kc_after, vc_after, kv_pos_after, np.array([pos]), np.array([slot]), None, 0, n_vis,
                            window, scale, 0.0)
    np.testing.assert_allclose(gpu.get(out, (1, n_head, hd)), expect, rtol=5e-4, atol=5e-4)
    assert not gpu.get(counters, (attn_decode.counters(n_head),), np.int32).any()


# The decode attention's tensor-core kernels (REFLEX_ATTN_TC=1: reflex_attn_decode_t2 / _t4 / _t8 where the
# heads fit, the tile loop elsewhere) through the same checks, whatever the default: every slice on tensor
# cores (REFLEX_ATTN_TC_MIN_KEYS=0), or, min_keys 64, the short slices through the tiles
@pytest.fixture(params=[0, 64], ids=["all", "min64"])
def tc_knobs(request, gpu, knobs):
    if tuple(gpu.dev.cc) < (8, 0):
        pytest.skip("the tensor-core decode attention needs an sm_80+ GPU")
    knobs.attn_tc, knobs.attn_tc_min_keys = True, request.param
    return knobs


@pytest.mark.parametrize("case", list(DECODE_ATTN_CASES))
@pytest.mark.parametrize("head_groups", [1, 4])
def test_attention_decode_on_tensor_cores(gpu, tc_knobs, case, head_groups):
    test_attention_decode(gpu, tc_knobs, case, head_groups)


@pytest.mark.parametrize("case", list(FUSED_ROPE_CASES))
def test_attention_decode_with_fused_rope_on_tensor_cores(gpu, tc_knobs, case):
    test_attention_decode_with_fused_rope_and_store(gpu, tc_knobs, case, 2)


@pytest.mark.parametrize("case", DEFER_CASES)
def test_attention_decode_on_tensor_cores_leaves_a_few_slices_unmerged(gpu, tc_knobs, case):
    test_attention_decode_leaves_a_few_slices_unmerged(gpu, tc_knobs, case, 1)
