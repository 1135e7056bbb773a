"""Matrix products: which kernel runs a product of a batch of tokens, the one place that chooses.

- below MM_MIN_TOKENS tokens the matrix-vector kernels (weights read once per 4 tokens; an RMS
  norm of the input can be folded in): for one token the staged decode kernels (ops/mvs.py)
  where they apply, else ops/matvec.py;
- from there the tensor-core kernels: sm_80+ ops/gemm.py, older GPUs ops/matmul.py's WMMA tiles.
"""

from __future__ import annotations

from .ops import gemm, matvec, mvs, norm
from .ops.matmul import mm as mm_wmma  # (this module's matmul is the dispatcher)
from .ops.common import Weight

# From this many tokens a matrix product goes to the tensor-core kernel (weights read once per
# 64 tokens) instead of the matrix-vector kernel (weights read once per 4 tokens). Since a prompt's
# narrow products split K to fill the GPU (gemm.k_splits), the tensor-core kernels win from 16
# tokens: a whole 16-token prompt of the Qwen3-0.6B shape 1.95 against 3.81 ms of GPU time, 32
# tokens 2.36 against 6.90 (Q8_0; Q4_K_M 2.27 / 4.33 and 2.71 / 7.66; H100, s38, scripts/bench_prompt.py).
# scripts/bench_prefill.py measures the crossover per weight type for the sm_80+ kernels; a type
# whose matrix-vector kernel keeps winning beyond MM_MIN_TOKENS gets its own (higher) entry in
# MM_MIN_TOKENS_BY_TYPE (a batch is still normalized once for the tensor-core path from
# MM_MIN_TOKENS on; such a type then runs the matrix-vector kernel on the normalized input).
MM_MIN_TOKENS = 16
MM_MIN_TOKENS_BY_TYPE: dict[str, int] = {}
# A decode batch of several sequences (Launcher.decode_rows) goes to the tensor-core kernels from
# this many rows: the matrix-vector kernels read the weights once per 4 rows, and a decode step
# of 16 Qwen3-0.6B rows took 7.9 ms that way against 6.2 ms through them (H200, scripts/bench_batch.py).
ROWS_MM_MIN_TOKENS = 4


def matvec_path(n_tok: int, type_name: str | None = None, rows: bool = False) -> bool:
    """True when a batch of n_tok tokens runs the matrix-vector kernels (which can fold an RMS
    norm of their input in); False when it runs the tensor-core kernels. Without a type: the
    batch's choice (whether its inputs get normalized by a separate kernel); with one: that
    weight type's choice for a batch whose inputs are normalized. Blocks and this module ask
    this; no other code compares against MM_MIN_TOKENS. rows: the batch is a decode step of that
    many sequences (ROWS_MM_MIN_TOKENS)."""
    if rows:
        return n_tok < ROWS_MM_MIN_TOKENS
    if n_tok < MM_MIN_TOKENS or type_name is None:
        return n_tok < MM_MIN_TOKENS
    return n_tok < MM_MIN_TOKENS_BY_TYPE.get(type_name, MM_MIN_TOKENS)


def matmul(L, w: Weight, x: int, y: int, n_tok: int, accumulate: bool = False, x_stride: int = 0, norm_w: int = 0,
           eps: float = 0.0, merge=None) -> None:
    """y[t, :] (+)= W x'[t, :] for t < n_tok, with y rows of w.rows floats. x' = x, or x RMS-normalized
    with weights norm_w (the matrix-vector path fuses it; pass norm_w only for small batches). merge
    (mvs.MvsMerge, one token, where mvs.takes_merge said so): x is the decode attention's output,
    whose slices this launch merges when the attention left them."""
    matmul_many(L, [w], x, [y], n_tok, accumulate, x_stride, norm_w, eps, merge=merge)


def matmul_many(L, ws: list[Weight], x: int, ys: list[int], n_tok: int, accumulate: bool = False, x_stride: int = 0,
                norm_w: int = 0, eps: float = 0.0, post=None, merge=None) -> None:
    """ys[i] (+)= ws[i] x' for up to three matrices of one input (q, k, v): one launch when they
    share a type and row length (either path), else one each. post (mvs.Post, one token, where
    mvs.folds_post said so): a post-norm folded into the staged launch; merge: as matmul's."""
    w0 = ws[0]
    x_stride = x_stride or w0.k
    one = len(ws) == 1  # (most calls: the checks over several matrices are a prompt's host time, s38)
    if (norm_w or post or merge or matvec_path(n_tok, w0.type_name, L.decode_rows)) and (
            one or all(w.k == w0.k for w in ws)):
        # matrix-vector path: segments() splits types where its kernel needs it (not one token)
        segments(L, ws, x, ys, n_tok, accumulate, x_stride, norm_w, eps, post, merge)
        return
    assert post is None and merge is None, "a folded post-norm or merge needs the staged one-token kernels"
    if not (one or all(w.type_name == w0.type_name and w.k == w0.k for w in ws)):
        for w, y in zip(ws, ys):
            matmul_many(L, [w], x, [y], n_tok, accumulate, x_stride, norm_w, eps)
        return
    if gemm.ok(L, w0) and (one or all(gemm.ok(L, w) for w in ws)):
        gemm.gemm(L, ws, x, ys, n_tok, accumulate, x_stride)
    elif w0.k % 64 == 0:
        for w, y in zip(ws, ys):
            mm_wmma(L, w, x, y, n_tok, accumulate, x_stride)
    else:
        segments(L, ws, x, ys, n_tok, accumulate, x_stride)


def segments(L, ws: list[Weight], x: int, ys: list[int], n_tok: int, accumulate: bool = False, x_stride: int = 0,
             norm_w: int = 0, eps: float = 0.0, post=None, merge=None) -> None:
    """Up to three matrix-vector products of the same row length in one launch (q, k, v); one
    launch per type where the types differ, except for one token (reflex_mvs_mixed)."""
    w0 = ws[0]
    assert 1 <= len(ws) <= 3 and all(w.k == w0.k for w in ws)
    if n_tok == 1 and mvs.segments(L, ws, x, ys, accumulate, norm_w, eps, post, merge):
        return
    assert post is None, "a folded post-norm needs the staged one-token kernels (mvs.folds_post)"
    assert merge is None, "a merged input needs the staged one-token kernel (mvs.takes_merge)"
    if any(w.type_name != w0.type_name for w in ws):  # the matrix-vector kernel reads one type: one launch each
        for w, y in zip(ws, ys):
            segments(L, [w], x, [y], n_tok, accumulate, x_stride, norm_w, eps)
        return
    matvec.segments(L, ws, x, ys, n_tok, accumulate, x_stride, norm_w, eps)


def gated_ffn_in(L, wg: Weight, wu: Weight, x: int, out: int, n_tok: int, act: int, g_buf: int, u_buf: int,
                 norm_w: int = 0, eps: float = 0.0, post=None) -> None:
    """out = act(Wg x') * (Wu x'); one fused pass when both weights share a type and row length
    (x' normalized on the fly when norm_w is given, matrix-vector path only; larger batches must
    pass a normalized x), else two products and the activation (g_buf, u_buf). One token goes
    through the staged kernel (weights read before the previous kernel ends) where it fits; post
    (mvs.Post): a post-norm folded into it (where mvs.folds_post said so)."""
    alike = wg.type_name == wu.type_name and wg.row_bytes == wu.row_bytes
    if alike and n_tok == 1 and mvs.glu(L, wg, wu, x, out, act, norm_w, eps, post):
        return
    assert post is None, "a folded post-norm needs the staged one-token kernels (mvs.folds_post)"
    if alike and (norm_w or matvec_path(n_tok, wg.type_name, L.decode_rows)):
        matvec.glu(L, wg, wu, x, out, n_tok, act, norm_w, eps)
        return
    if alike and not norm_w and gemm.ok(L, wg) and gemm.ok(L, wu):
        gemm.glu(L, wg, wu, x, out, n_tok, act)
        return
    matmul(L, wg, x, g_buf, n_tok, norm_w=norm_w, eps=eps)
    matmul(L, wu, x, u_buf, n_tok, norm_w=norm_w, eps=eps)
    norm.glu(L, g_buf, u_buf, out, n_tok * wg.rows, act)
