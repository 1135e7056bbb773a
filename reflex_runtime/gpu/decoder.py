"""The GPU forward pass of the dense decoder families (Qwen3, Gemma 3) over weights that sit in
the device arena exactly as they sit in the GGUF file.

Qwen3, per layer:  h = norm(x); q,k,v = W h; qk-norm + RoPE + cache store; a = attn;
                   x += Wo a; h = norm(x); x += Wd (silu(Wg h) * Wu h)
Gemma 3, per layer: the same with post-norms (x += norm(Wo a), x += norm(Wd ...)), GELU,
                   a sqrt(n_embd) embedding scale, local (sliding-window) layers with their own
                   RoPE base, and optional final logit soft-capping.
Qwen3-MoE: Qwen3's attention; the FFN is the routed experts of gpu/moe.py.
Residual adds are fused into the matrix kernels (Qwen3) or the norm kernel (Gemma 3), so a
decode step is 6-8 launches per layer, captured once into a CUDA graph by gpu/runner.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import UnsupportedModelError
from .moe import MoeFFN, MoeWeights, moe_unsupported
from .ops import ATTN_SPLITS_DECODE, MM_MIN_TOKENS, Ops, Weight, weight_from_tensor

GPU_FAMILIES = ("qwen3", "qwen3moe", "gemma3")
ARGMAX_PARTS = 128


def gpu_supports(config, gguf=None) -> str | None:
    """None if the CUDA engine runs this model, else the one-line reason it does not (with the
    file at hand, its tensor types are checked too)."""
    if config.arch not in GPU_FAMILIES:
        return f"the CUDA engine does not run '{config.arch}' yet (it runs {', '.join(GPU_FAMILIES)})"
    if config.head_dim > 256 or config.head_dim_v > 256 or config.head_dim_v % 32 or config.head_dim % 2:
        return f"head sizes {config.head_dim}/{config.head_dim_v} are outside what the attention kernel handles"
    if config.n_head % config.n_head_kv:
        return f"{config.n_head} query heads do not divide into {config.n_head_kv} KV heads"
    if config.arch == "qwen3moe":
        if config.n_embd % 32:
            return "hidden sizes must be multiples of 32"
        return moe_unsupported(config, gguf)
    if config.n_embd % 32 or config.n_ff % 32:
        return "hidden sizes must be multiples of 32"
    return None


class Arena:
    """Bump allocator over one device allocation (256-byte aligned pieces)."""

    def __init__(self):
        self.size = 0
        self.base = 0
        self._pending: list[tuple[str, int]] = []
        self.offsets: dict[str, int] = {}

    def reserve(self, name: str, nbytes: int) -> None:
        self.offsets[name] = self.size
        self.size += -(-max(nbytes, 4) // 256) * 256

    def ptr(self, name: str) -> int:
        return self.base + self.offsets[name]


@dataclass
class Layer:
    attn_norm: int
    wq: Weight
    wk: Weight
    wv: Weight
    wo: Weight
    q_norm: int
    k_norm: int
    ffn_norm: int
    wg: Weight | None  # None in an MoE layer
    wu: Weight | None
    wd: Weight | None
    post_attn_norm: int
    post_ffn_norm: int
    rope_base: float
    window: int
    k_cache: int
    v_cache: int
    moe: MoeWeights | None = None


class Decoder:
    """Sizes everything from the config, then runs forward passes for batches of tokens whose
    ids, positions and cache slots are already in the device state arrays."""

    def __init__(self, config, gguf, max_batch: int, n_ctx: int, max_new: int):
        self.cfg = config
        self.gguf = gguf
        self.max_batch = max_batch
        self.n_ctx = n_ctx
        self.max_new = max_new
        self.is_gemma = config.arch == "gemma3"
        ex = config.extra
        self.act = 1 if self.is_gemma else 0
        self.embed_scale = float(ex.get("embed_scale", 1.0)) if self.is_gemma else 1.0
        self.attn_scale = float(ex.get("query_scale", 1.0 / math.sqrt(config.head_dim)))
        self.softcap = float(ex.get("final_logit_softcap") or 0.0)
        self.weights_bytes = gguf.size - gguf.data_offset
        self.moe = MoeFFN(config, max_batch) if config.arch == "qwen3moe" else None
        n_ff = 0 if self.moe else config.n_ff
        c = config
        e, t = c.n_embd, max_batch
        a = Arena()
        a.reserve("weights", self.weights_bytes)
        kv_bytes = c.n_head_kv * n_ctx * (c.head_dim + c.head_dim_v) * 2
        for i in range(c.n_layers):
            a.reserve(f"kv{i}", kv_bytes)
        qd, kd, vd, ad = c.n_head * c.head_dim, c.n_head_kv * c.head_dim, c.n_head_kv * c.head_dim_v, c.n_head * c.head_dim_v
        for name, n in (("x", t * e), ("h", t * e), ("o", t * e), ("q", t * qd), ("k", t * kd), ("v", t * vd),
                        ("att", t * ad), ("g", t * n_ff), ("u", t * n_ff), ("act", t * n_ff),
                        ("logits", c.vocab_size), ("part_o", c.n_head * ATTN_SPLITS_DECODE * c.head_dim_v),
                        ("part_ml", c.n_head * ATTN_SPLITS_DECODE * 2), ("attn_counters", c.n_head),
                        ("amax_v", ARGMAX_PARTS), ("amax_i", ARGMAX_PARTS)):
            a.reserve(name, 4 * n)
        for name, n in self.moe.buffers() if self.moe else ():
            a.reserve(name, 4 * n)
        nt = max(t, n_ctx)  # per-token inputs cover a whole prompt, prefilled in chunks
        for name, n in (("tokens", nt), ("pos", nt), ("slot", nt), ("seg_lo", nt), ("n_kv", 1), ("step", 1),
                        ("out_tokens", max_new + 1), ("kv_pos", n_ctx)):
            a.reserve(name, 4 * n)
        a.reserve("sampling", 64)
        self.arena = a

    @property
    def arena_bytes(self) -> int:
        return self.arena.size

    # -- binding (after the arena exists and the weights are uploaded) ----------------------

    def bind(self, base: int, ops: Ops) -> None:
        self.arena.base = base
        self.ops = ops
        if hasattr(ops.dev, "memset32"):  # the split-attention counters start (and stay) at zero
            ops.dev.memset32(self.p("attn_counters"), 0, self.cfg.n_head, ops.stream)
        g, c = self.gguf, self.cfg
        wbase, doff = self.arena.ptr("weights"), g.data_offset

        def w(name):
            return weight_from_tensor(g.tensor(name), wbase, doff)

        def vec(name, required=True):
            ti = g.tensors.get(name)
            if ti is None:
                if required:
                    raise UnsupportedModelError(f"GGUF has no tensor '{name}'")
                return 0
            if ti.type_name != "F32":
                raise UnsupportedModelError(f"norm tensor '{name}' is {ti.type_name}; the CUDA engine expects F32")
            return wbase + ti.offset - doff

        ex = c.extra
        local = ex.get("local_layers") or (False,) * c.n_layers
        kv_half = c.n_head_kv * self.n_ctx * c.head_dim * 2
        self.layers = []
        for i in range(c.n_layers):
            p = f"blk.{i}."
            is_local = bool(local[i])
            self.layers.append(Layer(
                attn_norm=vec(p + "attn_norm.weight"), wq=w(p + "attn_q.weight"), wk=w(p + "attn_k.weight"),
                wv=w(p + "attn_v.weight"), wo=w(p + "attn_output.weight"),
                q_norm=vec(p + "attn_q_norm.weight", False), k_norm=vec(p + "attn_k_norm.weight", False),
                ffn_norm=vec(p + "ffn_norm.weight"),
                wg=None if self.moe else w(p + "ffn_gate.weight"), wu=None if self.moe else w(p + "ffn_up.weight"),
                wd=None if self.moe else w(p + "ffn_down.weight"), moe=self.moe.bind(w, p) if self.moe else None,
                post_attn_norm=vec(p + "post_attention_norm.weight", False) if self.is_gemma else 0,
                post_ffn_norm=vec(p + "post_ffw_norm.weight", False) if self.is_gemma else 0,
                rope_base=float(ex.get("rope_theta_local", c.rope_theta)) if is_local else c.rope_theta,
                window=int(ex.get("sliding_window", 0)) if is_local else 0,
                k_cache=self.arena.ptr(f"kv{i}"), v_cache=self.arena.ptr(f"kv{i}") + kv_half,
            ))
        self.tok_embd = w("token_embd.weight")
        self.output_norm = vec("output_norm.weight")
        self.lm_head = self.tok_embd if "output.weight" not in g.tensors else w("output.weight")
        if self.tok_embd.k != c.n_embd or self.lm_head.rows != c.vocab_size:
            raise UnsupportedModelError("token embedding / output shapes do not match the config")

    def p(self, name: str) -> int:
        return self.arena.ptr(name)

    def decode_bytes_per_token(self) -> int:
        """Weight bytes one decode step reads: the file's tensors less the embedding rows it
        skips (untied LM head) and the experts the router did not pick."""
        unread = 0
        if self.lm_head is not self.tok_embd:
            unread += self.tok_embd.rows * self.tok_embd.row_bytes - self.tok_embd.row_bytes
        for ly in self.layers:
            if ly.moe:
                m, n_exp = ly.moe, ly.moe.router.rows
                unread += (n_exp - self.moe.k) * (2 * m.gate_up_stride + m.down_stride)
        return self.weights_bytes - unread

    # -- the forward pass ---------------------------------------------------------------------

    def forward(self, n: int, first: int = 0, tree: bool = False, prefix_len: int = 0,
                logit_row: int = -1, logit_rows: int = 1, logits: int = 0) -> None:
        """Run n tokens (state arrays from index `first`) through every layer, then the LM head
        for rows [logit_row, logit_row + logit_rows) of this batch into `logits` (default: the
        one-row logits buffer). logit_rows = 0 skips the head."""
        c, ops = self.cfg, self.ops
        E = c.n_embd
        x, h, o = self.p("x"), self.p("h"), self.p("o")
        q, k, v, att = self.p("q"), self.p("k"), self.p("v"), self.p("att")
        toks = self.p("tokens") + 4 * first
        pos = self.p("pos") + 4 * first
        slot = self.p("slot") + 4 * first
        seg = self.p("seg_lo") + 4 * first if tree else 0
        n_split = ATTN_SPLITS_DECODE if n == 1 else 1
        small = n < MM_MIN_TOKENS  # matrix-vector path: norms fold into the matrix kernels
        eps = c.rms_eps
        ops.embed(self.tok_embd, toks, x, n, self.embed_scale)
        L = self.layers
        if not small or self.is_gemma:
            ops.rmsnorm(x, L[0].attn_norm, h, n, E, eps)
        for i, ly in enumerate(L):
            # Qwen3's small batches read x and normalize on the fly; otherwise h holds norm(x).
            fuse = small and not self.is_gemma
            src, nw = (x, ly.attn_norm) if fuse else (h, 0)
            self._qkv(ly, src, q, k, v, n, nw, eps)
            ops.qk_rope_store(q, k, v, ly.q_norm, ly.k_norm, pos, slot, self.p("kv_pos"), ly.k_cache, ly.v_cache, n,
                              c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v, c.rope_dim, ly.rope_base, 1.0,
                              eps, self.n_ctx)
            ops.attention(q, ly.k_cache, ly.v_cache, self.p("kv_pos"), pos, slot, seg, prefix_len, self.p("n_kv"), att,
                          self.p("part_o"), self.p("part_ml"), self.p("attn_counters"), n, c.n_head, c.n_head_kv,
                          c.head_dim, c.head_dim_v,
                          self.n_ctx, ly.window, self.attn_scale, 0.0, n_split)
            if self.is_gemma:
                ops.matmul(ly.wo, att, o, n)
                ops.rmsnorm(o, ly.ffn_norm, h, n, E, eps, resid=x, w_src=ly.post_attn_norm)
                ops.gated_ffn_in(ly.wg, ly.wu, h, self.p("act"), n, self.act, self.p("g"), self.p("u"))
            else:
                ops.matmul(ly.wo, att, x, n, accumulate=True)
                if ly.moe:
                    self.moe.forward(ops, self.p, ly.moe, x, h, n, self.act, ly.ffn_norm, eps)
                elif fuse:
                    ops.gated_ffn_in(ly.wg, ly.wu, x, self.p("act"), n, self.act, self.p("g"), self.p("u"),
                                     norm_w=ly.ffn_norm, eps=eps)
                else:
                    ops.rmsnorm(x, ly.ffn_norm, h, n, E, eps)
                    ops.gated_ffn_in(ly.wg, ly.wu, h, self.p("act"), n, self.act, self.p("g"), self.p("u"))
            nxt = L[i + 1].attn_norm if i + 1 < len(L) else 0
            if self.is_gemma:
                ops.matmul(ly.wd, self.p("act"), o, n)
                ops.rmsnorm(o, nxt, h if nxt else 0, n, E, eps, resid=x, w_src=ly.post_ffn_norm)
            else:
                if not ly.moe:
                    ops.matmul(ly.wd, self.p("act"), x, n, accumulate=True)
                if nxt and not small:
                    ops.rmsnorm(x, nxt, h, n, E, eps)
        if logit_rows <= 0:
            return
        row = (n - 1) if logit_row < 0 else logit_row
        out = logits or self.p("logits")
        xr = x + 4 * E * row
        if logit_rows < MM_MIN_TOKENS:  # the final norm folds into the LM head
            ops.matmul(self.lm_head, xr, out, logit_rows, norm_w=self.output_norm, eps=eps)
        else:
            ops.rmsnorm(xr, self.output_norm, h, logit_rows, E, eps)
            ops.matmul(self.lm_head, h, out, logit_rows)
        if self.softcap > 0:
            ops.softcap(out, logit_rows * c.vocab_size, self.softcap)

    def _qkv(self, ly: Layer, src: int, q: int, k: int, v: int, n: int, norm_w: int, eps: float) -> None:
        """q, k, v projections: one launch when the three share a type (most files), else three."""
        ws = (ly.wq, ly.wk, ly.wv)
        if n < MM_MIN_TOKENS and len({(w.type_name, w.k) for w in ws}) == 1:
            self.ops.matmul_segments(list(ws), src, [q, k, v], n, norm_w=norm_w, eps=eps)
            return
        for w, y in zip(ws, (q, k, v)):
            self.ops.matmul(w, src, y, n, norm_w=norm_w if n < MM_MIN_TOKENS else 0, eps=eps)
