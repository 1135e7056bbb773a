"""The paged KV cache (kvpool.py, kernels/common.cuh rx_kv_row) on the GPU: every kernel that
reads or writes a cache, given a block table, must compute exactly what it computes on the same
logical cache laid out slot by slot. Each test scatters the logical cache's blocks over a pool
twice its size in random order, fills every other row with NaN (a read through a wrong row
poisons the output), offsets the table by a few entries that point at a NaN block (a prompt
chunk's range, GpuModel.kv_table), and compares bit for bit with the unpaged launch, which the
kernel tests hold to numpy (tests/test_gpu_kernels.py, test_gpu_batch.py, test_gpu_deepseek2.py).

Run on a GPU machine: pytest -m gpu tests/test_gpu_paged.py
"""

import numpy as np
import pytest

from test_gpu_batch import ROW_CASES, _rows_problem
from test_gpu_deepseek2 import MLA_CASES
from test_gpu_kernels import FLASH_CASES, _prompt_problem, _sm80
from test_gpu_kernels import knobs  # noqa: F401 (the fixture)

from reflex_runtime.gpu.ops import attention, attn_decode, flash_attn, mla, rope
from reflex_runtime.kvpool import KV_BLOCK

pytestmark = pytest.mark.gpu

SKIP = 3  # table entries before the batch's range (pointing at a NaN block)


def _pad(a, axis, n):
    """a with its slot axis grown to n (random rows: never visible)."""
    extra = list(a.shape)
    extra[axis] = n - a.shape[axis]
    return np.concatenate([a, np.full(extra, 0.5, a.dtype)], axis=axis)


def _scatter(rng, arrays, axis):
    """The logical caches' blocks at random blocks of a pool twice as large (NaN elsewhere):
    (the physical arrays, the table with SKIP leading spare entries, physical rows)."""
    n = arrays[0].shape[axis]
    assert n % KV_BLOCK == 0
    nb = n // KV_BLOCK
    n_phys = 2 * nb + 1
    order = rng.permutation(n_phys)
    perm, spare = order[:nb], order[nb]
    out = []
    for a in arrays:
        shape = list(a.shape)
        shape[axis] = n_phys * KV_BLOCK
        p = np.full(shape, np.nan, a.dtype)
        pm, am = np.moveaxis(p, axis, 0), np.moveaxis(a, axis, 0)
        for i, b in enumerate(perm):
            pm[b * KV_BLOCK:(b + 1) * KV_BLOCK] = am[i * KV_BLOCK:(i + 1) * KV_BLOCK]
        out.append(p)
    table = np.concatenate([np.full(SKIP, spare), perm]).astype(np.int32)
    return out, table, n_phys * KV_BLOCK, perm


def _gather(phys, perm, axis):
    """The logical view of a physical cache."""
    pm = np.moveaxis(phys, axis, 0)
    return np.moveaxis(np.concatenate([pm[b * KV_BLOCK:(b + 1) * KV_BLOCK] for b in perm]), 0, axis)


def _up(n):
    return -(-n // KV_BLOCK) * KV_BLOCK


@pytest.mark.parametrize("case", ["qwen3_chunk_after_4096", "moe_gqa8", "gemma_hd256_window", "tree_window",
                                  "hd64_mha", "long_window_5000"])
def test_flash_attention_paged(gpu, case):
    _sm80(gpu)
    n_head, n_kvh, hd, n_tok, first, tree, window, softcap = FLASH_CASES[case]
    rng = np.random.default_rng(list(case.encode()))
    n_ctx = _up(first + n_tok + 37)
    kc, vc, q, q_slot, kv_pos = _prompt_problem(rng, n_head, n_kvh, hd, n_tok, first, n_ctx)
    seg_lo, prefix_len = None, 0
    if tree:  # a prompt of 4 tokens, then candidates of 3, 1, 4 tokens (as test_flash_attention)
        prefix_len = first + 4
        seg_lo = np.zeros(n_tok, dtype=np.int32)
        seg_lo[4:] = [first + 4] * 3 + [first + 7] + [first + 8] * 4
    (kp, vp), table, n_rows, _ = _scatter(rng, [kc, vc], 1)
    args = [gpu.put(q), None, None, gpu.put(kv_pos), gpu.put(q_slot), gpu.put(q_slot),
            gpu.put(seg_lo) if tree else 0, prefix_len, gpu.put(np.array([first + n_tok], np.int32))]
    outs = []
    for k, v, rows, blocks in ((kc, vc, n_ctx, 0), (kp, vp, n_rows, gpu.put(table) + 4 * SKIP)):
        args[1:3] = gpu.put(k), gpu.put(v)
        out = gpu.poisoned((n_tok, n_head, hd))
        flash_attn.attention(gpu.launch, *args, out, n_tok, n_head, n_kvh, hd, rows, window, 1 / np.sqrt(hd),
                             softcap, blocks=blocks)
        outs.append(gpu.get(out, (n_tok, n_head, hd)))
    assert not np.isnan(outs[0]).any()
    np.testing.assert_array_equal(outs[1], outs[0])


@pytest.mark.parametrize("case", list(ROW_CASES))
@pytest.mark.parametrize("kernel", ["decode", "decode_prefetch", "scalar"])
def test_decode_rows_paged(gpu, knobs, case, kernel):
    """Decode rows of a batch, each in its own range (continuous batching's step)."""
    (n_head, n_kvh, hd, window, R, n_ctx, scale), arrays, _ = _rows_problem(case)
    q, kc, vc, kv_pos, q_pos, q_slot, seq_lo = arrays
    n = _up(n_ctx)
    kc, vc, kv_pos = _pad(kc, 1, n), _pad(vc, 1, n), _pad(kv_pos, 0, n)
    rng = np.random.default_rng(list(case.encode()) + [7])
    (kp, vp), table, n_rows, _ = _scatter(rng, [kc, vc], 1)
    knobs.attn_min_keys = 16
    outs = []
    for k, v, rows, blocks in ((kc, vc, n, 0), (kp, vp, n_rows, gpu.put(table) + 4 * SKIP)):
        d = [gpu.put(x) for x in (q, k, v, kv_pos, q_pos, q_slot)]
        out = gpu.poisoned((R, n_head, hd))
        n_kv = gpu.put(np.array([n], np.int32))
        counters = gpu.put(np.zeros(attn_decode.counters(n_head, R), np.int32))
        if kernel == "scalar":
            attention.attention(gpu.launch, *d, gpu.put(seq_lo), 0, n_kv, out,
                                gpu.poisoned((R * n_head * attention.SPLITS_DECODE * hd,)),
                                gpu.poisoned((R * n_head * attention.SPLITS_DECODE * 2,)), counters, R, n_head, n_kvh,
                                hd, hd, rows, window, scale, 0.0, attention.SPLITS_DECODE, blocks=blocks)
        else:
            assert attn_decode.attention(gpu.launch, *d, n_kv, out,
                                         gpu.poisoned((R * n_head * attn_decode.SPLITS_MAX * hd,)),
                                         gpu.poisoned((R * n_head * attn_decode.SPLITS_MAX * 2,)), counters, n_head,
                                         n_kvh, hd, hd, rows, window, scale, 0.0, kernel == "decode_prefetch",
                                         window > 0, rows=R, seq_lo=gpu.put(seq_lo), blocks=blocks)
        outs.append(gpu.get(out, (R, n_head, hd)))
    assert not np.isnan(outs[0]).any()
    np.testing.assert_array_equal(outs[1], outs[0])


def test_rope_store_paged(gpu):
    """reflex_qk_rope_store writes each token's key and value to its slot's row (kv_pos by slot)."""
    rng = np.random.default_rng(11)
    n_tok, n_head, n_kvh, hd, n_ctx = 9, 8, 2, 128, 96
    q = rng.standard_normal((n_tok, n_head, hd)).astype(np.float32)
    k = rng.standard_normal((n_tok, n_kvh, hd)).astype(np.float32)
    v = rng.standard_normal((n_tok, n_kvh, hd)).astype(np.float32)
    pos = rng.integers(0, 3000, n_tok).astype(np.int32)
    slot = rng.permutation(n_ctx)[:n_tok].astype(np.int32)
    zero = np.zeros((n_kvh, n_ctx, hd), np.float16)
    (kp, vp), table, n_rows, perm = _scatter(rng, [zero, zero], 1)
    got = []
    for k0, v0, rows, blocks in ((zero, zero, n_ctx, 0), (kp, vp, n_rows, gpu.put(table) + 4 * SKIP)):
        dk, dv, kv_pos = gpu.put(k0), gpu.put(v0), gpu.put(np.full(n_ctx, -1, np.int32))
        rope.qk_rope_store(gpu.launch, gpu.put(q), gpu.put(k), gpu.put(v), 0, 0, gpu.put(pos), gpu.put(slot), kv_pos,
                           dk, dv, n_tok, n_head, n_kvh, hd, hd, hd, 1e6, 1.0, 1e-6, rows, blocks=blocks)
        shape = (n_kvh, rows, hd)
        got.append((gpu.get(dk, shape, np.float16), gpu.get(dv, shape, np.float16), gpu.get(kv_pos, (n_ctx,), np.int32)))
    (k_flat, v_flat, pos_flat), (k_paged, v_paged, pos_paged) = got
    assert (k_flat[:, slot] != 0).any()
    np.testing.assert_array_equal(_gather(k_paged, perm, 1), k_flat)
    np.testing.assert_array_equal(_gather(v_paged, perm, 1), v_flat)
    np.testing.assert_array_equal(pos_paged, pos_flat)
    mapped = np.zeros(n_rows, bool)
    for b in perm:
        mapped[b * KV_BLOCK:(b + 1) * KV_BLOCK] = True
    assert np.isnan(k_paged[:, ~mapped].astype(np.float32)).all(), "a row outside the table was written"


@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("n_vis", [300, 20])
def test_fused_rope_decode_paged(gpu, knobs, prefetch, n_vis):
    """The decode attention's fused rope + store: the new key and value go to the slot's row."""
    from reflex_runtime.gpu.ops.attn_decode import AtdRope

    rng = np.random.default_rng([5, prefetch, n_vis])
    n_head, n_kvh, hd = 16, 8, 128
    n_ctx = _up(n_vis + 21)
    slot, pos = n_vis - 1, n_vis + 4
    kc = rng.standard_normal((n_kvh, n_ctx, hd)).astype(np.float16)
    vc = rng.standard_normal((n_kvh, n_ctx, hd)).astype(np.float16)
    kv_pos = (np.arange(n_ctx) + 5).astype(np.int32)
    q = (rng.standard_normal((n_head, hd)) * 2).astype(np.float32)
    k_raw, v_raw = rng.standard_normal((2, n_kvh, hd)).astype(np.float32)
    (kp, vp), table, n_rows, perm = _scatter(rng, [kc, vc], 1)
    knobs.attn_min_keys = 32
    got = []
    for k, v, rows, blocks in ((kc, vc, n_ctx, 0), (kp, vp, n_rows, gpu.put(table) + 4 * SKIP)):
        dk, dv = gpu.put(k), gpu.put(v)
        r = AtdRope(gpu.put(k_raw), gpu.put(v_raw), None, None, None, 1e-6, 1e4, 1.0, hd, 0,
                    gpu.put(np.array(attn_decode.rope_theta(1e4, 1.0, hd))))
        out = gpu.poisoned((1, n_head, hd))
        assert attn_decode.attention(gpu.launch, gpu.put(q), dk, dv, gpu.put(kv_pos), gpu.put(np.array([pos], np.int32)),
                                     gpu.put(np.array([slot], np.int32)), gpu.put(np.array([n_vis], np.int32)), out,
                                     gpu.poisoned((n_head * attn_decode.SPLITS_MAX * hd,)),
                                     gpu.poisoned((n_head * attn_decode.SPLITS_MAX * 2,)),
                                     gpu.put(np.zeros(attn_decode.counters(n_head), np.int32)), n_head, n_kvh, hd, hd, rows, 0,
                                     1 / np.sqrt(hd), 0.0, prefetch, False, r, blocks=blocks)
        got.append((gpu.get(out, (1, n_head, hd)), gpu.get(dk, (n_kvh, rows, hd), np.float16)))
    np.testing.assert_array_equal(got[1][0], got[0][0])
    np.testing.assert_array_equal(_gather(got[1][1], perm, 1), got[0][1])


@pytest.mark.parametrize("case", ["decode_v2lite", "decode_partial_group", "prefill_odd", "tree_v2lite"])
def test_mla_paged(gpu, case):
    """The latent cache: rope_store writes each token's row, the attention reads rows by slot."""
    from reflex_runtime.families.deepseek2.config import rope_frequencies
    from reflex_runtime.gpu.ops.mla import MlaRope

    n_head, r, rope_d, n_tok, first, tree = MLA_CASES[case]
    rng = np.random.default_rng(list(case.encode()))
    d, nope = r + rope_d, 32
    n_ctx = _up(max(200, first + n_tok + 1))
    cache = rng.standard_normal((n_ctx, d)).astype(np.float16)
    q = rng.standard_normal((n_tok, n_head, nope + rope_d)).astype(np.float32)
    kv = rng.standard_normal((n_tok, d)).astype(np.float32)
    qm = rng.standard_normal((n_tok, n_head, d)).astype(np.float32)
    nw = (rng.random(r) + 0.5).astype(np.float32)
    q_slot = np.arange(first, first + n_tok, dtype=np.int32)
    seg_lo, prefix_len = None, 0
    if tree:
        prefix_len = first + 4
        seg_lo = np.zeros(n_tok, dtype=np.int32)
        seg_lo[4:] = [first + 4] * 3 + [first + 7] + [first + 8] * 4
    e = dict(qk_rope=rope_d, rope_scaling="none", rope_factor=1.0, yarn_orig_ctx=64, yarn_beta_fast=32.0,
             yarn_beta_slow=1.0, rope_attn_factor=1.0)
    tab = MlaRope.of(rope_frequencies(e, 10_000.0))
    (cp,), table, n_rows, perm = _scatter(rng, [cache], 0)
    n_split = mla.SPLITS_DECODE if n_tok == 1 else 1
    got = []
    for c, blocks in ((cache, 0), (cp, gpu.put(table) + 4 * SKIP)):
        dc, dqm, slot = gpu.put(c), gpu.put(qm), gpu.put(q_slot)
        mla.rope_store(gpu.launch, gpu.put(q), dqm, gpu.put(kv), gpu.put(nw), slot, slot, dc, tab, 1.0, n_tok, n_head,
                       nope, rope_d, r, 1e-6, blocks=blocks)
        out = gpu.poisoned((n_tok, n_head, r))
        mla.attention(gpu.launch, dqm, dc, slot, gpu.put(seg_lo) if tree else 0, prefix_len,
                      gpu.put(np.array([first + n_tok], np.int32)), out,
                      gpu.poisoned((n_head * mla.SPLITS_DECODE * r,)), gpu.poisoned((n_head * mla.SPLITS_DECODE * 2,)),
                      gpu.put(np.zeros(mla.counters(n_tok, n_head), np.int32)), n_tok, n_head, r, d, 0.1, n_split,
                      blocks=blocks)
        got.append((gpu.get(out, (n_tok, n_head, r)), gpu.get(dc, (len(c), d), np.float16)))
    assert not np.isnan(got[0][0]).any()
    np.testing.assert_array_equal(got[1][0], got[0][0])
    np.testing.assert_array_equal(_gather(got[1][1], perm, 0), got[0][1])
