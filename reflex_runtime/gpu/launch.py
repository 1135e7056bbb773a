"""Typed launchers for the kernels in kernels/*.cu: one method per op, argument packs in the
kernel's parameter order, and the one place that chooses between the matrix-vector and the
tensor-core paths (`matvec_path`). Every method only enqueues work on the launcher's stream (so it
can be captured into a graph). `record()` keeps each launch with the role the calling block gave
it and the weight bytes it reads, which is how `reflex bench` times a decode step kind by kind.
"""

from __future__ import annotations

from contextlib import contextmanager
from ctypes import Structure, c_float, c_int, c_long, c_void_p
from dataclasses import dataclass

from ..errors import UnsupportedModelError
from .kernels import WEIGHT_TYPES

# From this many tokens a matrix product goes to the tensor-core kernel (weights read once per
# 64 tokens) instead of the matrix-vector kernel (weights read once per 4 tokens). Below it the
# matrix-vector path wins on the H200: a 16-token prefill of Qwen3-0.6B took 22 ms through the
# tensor-core kernel (too few tiles to fill the GPU), and 16/4 weight passes cost ~3 ms.
MM_MIN_TOKENS = 64
ATTN_SPLITS_DECODE = 16


def matvec_path(n_tok: int) -> bool:
    """True when a batch of n_tok tokens runs the matrix-vector kernels (which can fold an RMS
    norm of their input in); False when it runs the tensor-core kernels. Blocks ask this; no
    other code compares against MM_MIN_TOKENS."""
    return n_tok < MM_MIN_TOKENS


@dataclass
class Launch:
    """One recorded launch: enough to replay it (its argument pack is kept alive here)."""

    kernel: object
    grid: tuple
    block: int
    args: list
    role: str
    weight_bytes: int


@dataclass(frozen=True)
class Weight:
    ptr: int
    type_name: str
    rows: int  # output features
    k: int  # input features (row length)
    row_bytes: int

    @property
    def suffix(self) -> str:
        return WEIGHT_TYPES[self.type_name]

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes


class MvSegs(Structure):
    """Mirror of kernels/matvec.cu's MvSegs: up to three matrices in one launch."""

    _fields_ = [("w", c_void_p * 3), ("y", c_void_p * 3), ("rows", c_int * 3)]


def weight_from_tensor(ti, base: int, data_offset: int) -> Weight:
    from ..ggml_types import GGML_TYPES

    t = GGML_TYPES[ti.ggml_type]
    if t.name not in WEIGHT_TYPES:
        raise UnsupportedModelError(f"tensor '{ti.name}' is {t.name}, which the CUDA kernels do not read")
    k = ti.shape[0]
    rows = ti.n_elements // k
    if k % 32:
        raise UnsupportedModelError(f"tensor '{ti.name}' rows of {k} are not a multiple of 32")
    return Weight(base + ti.offset - data_offset, t.name, rows, k, k // t.block_size * t.type_size)


class Launcher:
    def __init__(self, device, stream):
        self.dev = device
        self.stream = stream
        self.launches = 0  # counted so tests can assert how many passes a request made
        self.pdl = False  # programmatic dependent launches (set while capturing the decode graph)
        self._k = device.kernel
        # Warps the matrix-vector kernels aim to keep in flight: 32 per SM hides the load latency.
        self._target_warps = 32 * device.sm_count
        self._recorded: list[Launch] | None = None
        self._role = ""
        self._bytes = 0

    @contextmanager
    def record(self):
        """Keep every launch made inside the block (still enqueued as usual): yields the list."""
        self._recorded = out = []
        try:
            yield out
        finally:
            self._recorded = None

    @contextmanager
    def role(self, name: str, weight_bytes: int = 0):
        """Tag the launches made inside with what they do (and the weight bytes they read)."""
        prev = self._role, self._bytes
        self._role, self._bytes = name, weight_bytes
        try:
            yield
        finally:
            self._role, self._bytes = prev

    def _wpr(self, rows: int, k: int) -> int:
        """Warps per output row: split K across warps when there are too few rows to fill the GPU
        and rows are long enough that every warp keeps >= 4 steps of 256 weights (measured on the
        H200: splitting 1024-long rows costs more in reductions than it gains)."""
        wpr = 1
        while wpr < 8 and rows * wpr < self._target_warps and (wpr * 2) * 4 <= k // 256:
            wpr *= 2
        return wpr

    @staticmethod
    def _rpw(rows_per_segment: list[int], n_tok: int, wpr: int) -> int:
        """Rows per warp for one-token products: each x load then serves 2 or 4 rows."""
        if n_tok != 1 or wpr != 1:
            return 1
        total = sum(rows_per_segment)
        for r in (4, 2):
            if total >= 2048 * r and all(n % r == 0 for n in rows_per_segment):
                return r
        return 1

    def _go(self, name, grid, block, args) -> None:
        kernel = self._k(name)
        kernel.launch(grid, block, args, self.stream, pdl=self.pdl)
        self.launches += 1
        if self._recorded is not None:
            g = grid if isinstance(grid, tuple) else (grid, 1, 1)
            self._recorded.append(Launch(kernel, g, block, args, self._role or name, self._bytes))

    # -- elementwise and norms -------------------------------------------------------------

    def embed(self, table: Weight, tokens: int, out: int, n_tok: int, scale: float) -> None:
        self._go(f"reflex_embed_{table.suffix}", n_tok, 256,
                 [c_void_p(table.ptr), c_long(table.row_bytes), c_void_p(tokens), c_void_p(out), c_int(table.k),
                  c_int(table.rows), c_float(scale)])

    def rmsnorm(self, src: int, w_out: int, out: int, rows: int, n: int, eps: float, resid: int = 0, w_src: int = 0) -> None:
        block = 1024 if n >= 4096 else 256
        self._go("reflex_rmsnorm", rows, block,
                 [c_void_p(src), c_void_p(w_src or None), c_void_p(resid or None), c_void_p(w_out), c_void_p(out or None),
                  c_int(n), c_float(eps)])

    def glu(self, gate: int, up: int, out: int, n: int, act: int) -> None:
        self._go("reflex_glu", (n + 255) // 256, 256, [c_void_p(gate), c_void_p(up), c_void_p(out), c_long(n), c_int(act)])

    def scale(self, y: int, n: int, s: float) -> None:
        self._go("reflex_scale", (n + 255) // 256, 256, [c_void_p(y), c_long(n), c_float(s)])

    def softcap(self, y: int, n: int, cap: float) -> None:
        self._go("reflex_softcap", (n + 255) // 256, 256, [c_void_p(y), c_long(n), c_float(cap)])

    # -- matrix products -------------------------------------------------------------------

    def matmul(self, w: Weight, x: int, y: int, n_tok: int, accumulate: bool = False, x_stride: int = 0,
               norm_w: int = 0, eps: float = 0.0) -> None:
        """y[t, :] (+)= W x'[t, :] for t < n_tok, with y rows of w.rows floats. x' = x, or x RMS-normalized
        with weights norm_w (the matrix-vector path fuses it; pass norm_w only for small batches)."""
        x_stride = x_stride or w.k
        if not matvec_path(n_tok) and w.k % 64 == 0 and not norm_w:
            self._go(f"reflex_mm_{w.suffix}", ((w.rows + 127) // 128, (n_tok + 63) // 64, 1), 256,
                     [c_void_p(w.ptr), c_long(w.row_bytes), c_void_p(x), c_int(x_stride), c_void_p(y), c_int(w.rows),
                      c_int(w.rows), c_int(w.k), c_int(n_tok), c_int(int(accumulate))])
            return
        self.matmul_segments([w], x, [y], n_tok, accumulate, x_stride, norm_w, eps)

    def matmul_segments(self, ws: list[Weight], x: int, ys: list[int], n_tok: int, accumulate: bool = False,
                        x_stride: int = 0, norm_w: int = 0, eps: float = 0.0) -> None:
        """Up to three matrix-vector products of the same type and row length in one launch (q, k, v)."""
        w0 = ws[0]
        assert 1 <= len(ws) <= 3 and all(w.type_name == w0.type_name and w.k == w0.k for w in ws)
        segs = MvSegs()
        for i, (w, y) in enumerate(zip(ws, ys)):
            segs.w[i], segs.y[i], segs.rows[i] = w.ptr, y, w.rows
        total = sum(w.rows for w in ws)
        wpr = self._wpr(total, w0.k)
        rpw = self._rpw([w.rows for w in ws], n_tok, wpr)
        per_block = 8 // wpr * rpw
        self._go(f"reflex_mv_{w0.suffix}", (total + per_block - 1) // per_block, 256,
                 [segs, c_long(w0.row_bytes), c_void_p(x), c_int(x_stride or w0.k), c_int(w0.k), c_int(n_tok),
                  c_int(int(accumulate)), c_void_p(norm_w or None), c_float(eps), c_int(wpr), c_int(rpw)])

    def gated_ffn_in(self, wg: Weight, wu: Weight, x: int, out: int, n_tok: int, act: int, g_buf: int, u_buf: int,
                     norm_w: int = 0, eps: float = 0.0) -> None:
        """out = act(Wg x') * (Wu x'); one fused pass when both weights share a type and the batch is
        small (x' normalized on the fly when norm_w is given; large batches must pass a normalized x)."""
        if wg.type_name == wu.type_name and wg.row_bytes == wu.row_bytes and matvec_path(n_tok):
            wpr = self._wpr(2 * wg.rows, wg.k)
            per_block = 8 // wpr
            self._go(f"reflex_mv_glu_{wg.suffix}", (wg.rows + per_block - 1) // per_block, 256,
                     [c_void_p(wg.ptr), c_void_p(wu.ptr), c_long(wg.row_bytes), c_void_p(x), c_int(wg.k), c_void_p(out),
                      c_int(wg.rows), c_int(wg.rows), c_int(wg.k), c_int(n_tok), c_int(act), c_void_p(norm_w or None),
                      c_float(eps), c_int(wpr)])
            return
        self.matmul(wg, x, g_buf, n_tok, norm_w=norm_w, eps=eps)
        self.matmul(wu, x, u_buf, n_tok, norm_w=norm_w, eps=eps)
        self.glu(g_buf, u_buf, out, n_tok * wg.rows, act)

    # -- routed experts (kernels/moe.cu) -----------------------------------------------------

    def moe_topk(self, logits: int, n_tok: int, n_expert: int, k: int, normalize: bool, ids: int, weights: int) -> None:
        self._go("reflex_moe_topk", n_tok, 256, [c_void_p(logits), c_int(n_expert), c_int(k), c_int(int(normalize)),
                                                  c_void_p(ids), c_void_p(weights)])

    def moe_glu_mv(self, wg: Weight, wu: Weight, expert_bytes: int, ids: int, k: int, x: int, out: int, n_tok: int,
                   n_ff: int, act: int, norm_w: int = 0, eps: float = 0.0) -> None:
        """out[t*k+s] = act(gate_e x'[t]) * (up_e x'[t]) for expert e = ids[t*k+s], one launch."""
        wpr = self._wpr(n_ff * n_tok * k, wg.k)
        per_block = 8 // wpr
        self._go(f"reflex_moe_mv_glu_{wg.suffix}", ((n_ff + per_block - 1) // per_block, n_tok * k, 1), 256,
                 [c_void_p(wg.ptr), c_void_p(wu.ptr), c_long(wg.row_bytes), c_long(expert_bytes), c_void_p(ids), c_int(k),
                  c_void_p(x), c_int(wg.k), c_void_p(out), c_int(n_ff), c_int(wg.k), c_int(act), c_void_p(norm_w or None),
                  c_float(eps), c_int(wpr)])

    def moe_down_mv(self, wd: Weight, expert_bytes: int, ids: int, weights: int, k: int, act: int, x: int, n_tok: int,
                    n_embd: int) -> None:
        """x[t] += sum over t's k slots of weight * down_e act[t*k+s] (the residual add fused)."""
        wpr = self._wpr(n_embd * n_tok, wd.k)
        per_block = 8 // wpr
        self._go(f"reflex_moe_mv_down_{wd.suffix}", ((n_embd + per_block - 1) // per_block, n_tok, 1), 256,
                 [c_void_p(wd.ptr), c_long(wd.row_bytes), c_long(expert_bytes), c_void_p(ids), c_void_p(weights), c_int(k),
                  c_void_p(act), c_int(wd.k), c_void_p(x), c_int(n_embd), c_int(wpr)])

    def moe_group(self, ids: int, n_pairs: int, n_expert: int, k: int, counts: int, offsets: int, pair_tok: int,
                  pair_id: int) -> None:
        self._go("reflex_moe_group", 1, 1024, [c_void_p(ids), c_int(n_pairs), c_int(n_expert), c_int(k), c_void_p(counts),
                                               c_void_p(offsets), c_void_p(pair_tok), c_void_p(pair_id)])

    def moe_mm(self, w: Weight, expert_bytes: int, n_expert: int, n_rows: int, counts: int, offsets: int, x_idx: int,
               y_idx: int, x: int, y: int) -> None:
        """y[y_idx[i]] = W_e x[x_idx[i]] for the rows i of every expert's group, on tensor cores."""
        self._go(f"reflex_moe_mm_{w.suffix}", ((n_rows + 127) // 128, n_expert, 1), 256,
                 [c_void_p(w.ptr), c_long(w.row_bytes), c_long(expert_bytes), c_void_p(counts), c_void_p(offsets),
                  c_void_p(x_idx), c_void_p(y_idx), c_void_p(x), c_int(w.k), c_void_p(y), c_int(n_rows), c_int(n_rows),
                  c_int(w.k)])

    def moe_combine(self, y: int, weights: int, k: int, x: int, n_embd: int, n_tok: int) -> None:
        self._go("reflex_moe_combine", (n_tok * n_embd + 255) // 256, 256,
                 [c_void_p(y), c_void_p(weights), c_int(k), c_void_p(x), c_int(n_embd), c_int(n_tok)])

    # -- attention -------------------------------------------------------------------------

    def qk_rope_store(self, q, k, v, q_norm, k_norm, pos, slot, kv_pos, k_cache, v_cache, n_tok, n_head, n_head_kv,
                      hd, hd_v, rope_dim, base, freq_scale, eps, n_ctx) -> None:
        self._go("reflex_qk_rope_store", (n_tok, n_head + n_head_kv, 1), 128,
                 [c_void_p(q), c_void_p(k), c_void_p(v), c_void_p(q_norm or None), c_void_p(k_norm or None), c_void_p(pos),
                  c_void_p(slot), c_void_p(kv_pos), c_void_p(k_cache), c_void_p(v_cache), c_int(n_head), c_int(n_head_kv),
                  c_int(hd), c_int(hd_v), c_int(rope_dim), c_float(base), c_float(freq_scale), c_float(eps), c_int(n_ctx)])

    def attention(self, q, k_cache, v_cache, kv_pos, q_pos, q_slot, seg_lo, prefix_len, n_kv, out, part_o, part_ml,
                  counters, n_tok, n_head, n_head_kv, hd, hd_v, n_ctx, window, scale, softcap, n_split) -> None:
        """counters: n_tok * n_head zeroed ints (n_split > 1 only); the kernel leaves them zeroed."""
        self._go("reflex_attn", (n_tok, n_head, n_split), 128,
                 [c_void_p(q), c_void_p(k_cache), c_void_p(v_cache), c_void_p(kv_pos), c_void_p(q_pos), c_void_p(q_slot),
                  c_void_p(seg_lo or None), c_int(prefix_len), c_void_p(n_kv), c_void_p(out), c_void_p(part_o or None),
                  c_void_p(part_ml or None), c_void_p(counters or None), c_int(n_head), c_int(n_head_kv), c_int(hd),
                  c_int(hd_v), c_int(n_ctx), c_int(window), c_float(scale), c_float(softcap), c_int(n_split)])

    # -- Gated DeltaNet and sigmoid gates (kernels/delta_net.cu, kernels/gated.cu) ------------

    def dn_conv(self, x, w, state, state_stride, seq_start, n_seq, pos, out, n_tok, k, nk, nv, dk, dv, q_scale, eps,
                roll) -> None:
        """Causal conv + SiLU + q/k L2 norm of n_tok tokens; roll: every sequence is one token and
        the kernel shifts the conv state itself (else dn_conv_state must follow)."""
        self._go("reflex_dn_conv", (2 * nk + nv, (n_tok + 7) // 8, 1), 256,
                 [c_void_p(x), c_void_p(w), c_void_p(state), c_long(state_stride), c_void_p(seq_start or None),
                  c_int(n_seq), c_void_p(pos), c_void_p(out), c_int(n_tok), c_int(k), c_int(nk), c_int(nv), c_int(dk),
                  c_int(dv), c_float(q_scale), c_float(eps), c_int(int(roll))])

    def dn_conv_state(self, x, state, state_stride, seq_start, n_seq, pos, n_tok, channels, k) -> None:
        self._go("reflex_dn_conv_state", ((channels + 255) // 256, n_seq, 1), 256,
                 [c_void_p(x), c_void_p(state), c_long(state_stride), c_void_p(seq_start or None), c_int(n_seq),
                  c_void_p(pos), c_int(n_tok), c_int(channels), c_int(k)])

    def dn_recurrent(self, qkv, alpha, beta, z, ssm_a, dt_bias, norm_w, state, state_stride, seq_start, n_seq, pos, out,
                     n_tok, nk, nv, dk, dv, eps) -> None:
        """The delta rule token by token with the gated output norm fused (one block per value head and sequence)."""
        self._go("reflex_dn_recurrent", (nv, n_seq, 1), 256,
                 [c_void_p(qkv), c_void_p(alpha), c_void_p(beta), c_void_p(z), c_void_p(ssm_a), c_void_p(dt_bias),
                  c_void_p(norm_w), c_void_p(state), c_long(state_stride), c_void_p(seq_start or None), c_int(n_seq),
                  c_void_p(pos), c_void_p(out), c_int(n_tok), c_int(nk), c_int(nv), c_int(dk), c_int(dv), c_float(eps)])

    def dn_chunked(self, qkv, alpha, beta, ssm_a, dt_bias, state, state_stride, seq_start, n_seq, pos, out, n_tok, nk,
                   nv, dk, dv) -> None:
        """The delta rule DN_CHUNK tokens at a time; `out` gets the unnormalized output (dn_gated_norm next)."""
        self._go("reflex_dn_chunked", (nv, (dv + 31) // 32, n_seq), 256,
                 [c_void_p(qkv), c_void_p(alpha), c_void_p(beta), c_void_p(ssm_a), c_void_p(dt_bias), c_void_p(state),
                  c_long(state_stride), c_void_p(seq_start or None), c_int(n_seq), c_void_p(pos), c_void_p(out),
                  c_int(n_tok), c_int(nk), c_int(nv), c_int(dk), c_int(dv)])

    def dn_gated_norm(self, o, z, w, out, rows, dv, eps) -> None:
        self._go("reflex_dn_gated_norm", (rows + 7) // 8, 256,
                 [c_void_p(o), c_void_p(z), c_void_p(w), c_void_p(out), c_int(rows), c_int(dv), c_float(eps)])

    def gate_split(self, qg: int, q: int, gate: int, n: int, hd: int) -> None:
        """Per-head [query | gate] rows -> q, gate ((n / hd) rows of hd floats each)."""
        self._go("reflex_gate_split", (n + 255) // 256, 256,
                 [c_void_p(qg), c_void_p(q), c_void_p(gate), c_long(n), c_int(hd)])

    def sigmoid_mul(self, y: int, g: int, n: int, group: int = 1) -> None:
        """y[i] *= sigmoid(g[i // group]) for i < n."""
        self._go("reflex_sigmoid_mul", (n + 255) // 256, 256, [c_void_p(y), c_void_p(g), c_long(n), c_int(group)])

    # -- sampling and scoring --------------------------------------------------------------

    def argmax(self, logits: int, n: int, part_v: int, part_i: int, n_part: int, state, last: int) -> None:
        self._go("reflex_argmax_partial", n_part, 1024, [c_void_p(logits), c_int(n), c_void_p(part_v), c_void_p(part_i)])
        self._go("reflex_argmax_final", 1, 32, [c_void_p(part_v), c_void_p(part_i), c_int(n_part), state, c_int(last)])

    def sample(self, logits: int, n: int, sampling_ptr: int, state, last: int) -> None:
        self._go("reflex_sample", 1, 1024, [c_void_p(logits), c_int(n), c_void_p(sampling_ptr), state, c_int(last)])

    def logprob_rows(self, logits: int, n_vocab: int, rows: int, tokens: int, out: int, n: int) -> None:
        self._go("reflex_logprob_rows", n, 1024, [c_void_p(logits), c_int(n_vocab), c_void_p(rows), c_void_p(tokens),
                                                   c_void_p(out)])
