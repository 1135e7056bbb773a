"""DeepSeek-V2 / V2-Lite / V3 in numpy (the layer diagram, routing rules and llama.cpp's
conventions are in config.py).

The cache holds, per layer and token, only the latent key row [c | k_pe] (kv_lora_rank +
qk_rope floats, one MQA head); values are its first kv_lora_rank columns. Attention runs in the
absorbed form: each head's query is [W_k[h]^T q_nope | q_pe] against that row, and W_v[h] is
applied to the attended latent."""

from __future__ import annotations

import numpy as np

from ...modelfile import tensor_names as T
from ...reference import blocks, layers
from ...reference.base import ReferenceModel
from .config import rope_frequencies

_F32 = np.float32


def rope_tables(positions: np.ndarray, e: dict, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin (n, rope/2) for pair i: angle = pos * f_i with config.rope_frequencies (YaRN
    included); cos/sin are multiplied by the rope attention factor. float64, rounded once."""
    freq = np.array(rope_frequencies(e, theta), dtype=np.float64)  # the table the GPU kernels get
    ang = np.asarray(positions, dtype=np.float64)[:, None] * freq[None, :]
    a = e["rope_attn_factor"]
    return (np.cos(ang) * a).astype(_F32), (np.sin(ang) * a).astype(_F32)


def _choices(logits: np.ndarray, e: dict, bias: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(probs, choice scores with the dropped groups' experts at -inf, the margin of the group
    choice: the last kept group's score minus the best dropped one's, inf without groups)."""
    z = logits.astype(_F32, copy=False)
    if e["gating"] == "sigmoid":
        with np.errstate(over="ignore"):  # exp(-z) = inf for very negative z: probability 0
            probs = (_F32(1.0) / (_F32(1.0) + np.exp(-z))).astype(_F32, copy=False)
    else:
        ez = np.exp(z - z.max(axis=-1, keepdims=True))
        probs = (ez / ez.sum(axis=-1, keepdims=True)).astype(_F32, copy=False)
    choice = probs + bias if bias is not None else probs
    n, n_exp = choice.shape
    g, used = e["n_group"], e["n_group_used"]
    group_margin = np.full(n, np.inf)
    if g > 1:
        per = choice.reshape(n, g, n_exp // g)
        if e["group_score"] == "top2":  # V3: the sum of each group's two best
            top = -np.sort(-per, axis=-1)[..., :min(2, n_exp // g)]
            group_score = top.sum(axis=-1)
        else:  # V2 group_limited_greedy: each group's best
            group_score = per.max(axis=-1)
        order = np.argsort(-group_score, axis=-1, kind="stable")
        keep = order[:, :used]
        if used < g:
            ranked = np.take_along_axis(group_score, order, axis=-1)
            group_margin = (ranked[:, used - 1] - ranked[:, used]).astype(np.float64)
        mask = np.zeros((n, g), dtype=bool)
        np.put_along_axis(mask, keep, True, axis=-1)
        choice = np.where(np.repeat(mask, n_exp // g, axis=-1), choice, _F32(-np.inf))
    return probs, choice, group_margin


def route(logits: np.ndarray, e: dict, bias: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Router logits (n, n_expert) -> (expert ids (n, k) int64, weights (n, k) float32), by the
    rules in config.py. Stable sorts: equal scores go to the lower id."""
    probs, choice, _ = _choices(logits, e, bias)
    ids = np.argsort(-choice, axis=-1, kind="stable")[:, :e["n_expert_used"]]
    w = np.take_along_axis(probs, ids, axis=-1)
    if e["weights_norm"]:
        w = blocks.normalize_weights(w)
    return ids, (w * _F32(e["weights_scale"])).astype(_F32, copy=False)


def route_margin(logits: np.ndarray, e: dict, bias: np.ndarray | None) -> np.ndarray:
    """Per token (n,): how close its routing came to another choice, relative to its largest
    choice score: min(last chosen expert - best unchosen one, last kept group - best dropped
    one) / max |choice score|; inf when nothing was left out. A small margin is a near-tie that
    any rounding of the router's input (the GPU's f16 latent cache, f16 tensor-core inputs) may
    resolve the other way, changing that token's experts and so its logits by far more than the
    rounding itself (`reflex check` excuses such rows, see check.py)."""
    probs, choice, margin = _choices(logits, e, bias)
    k = e["n_expert_used"]
    unmasked = probs + bias if bias is not None else probs
    scale = np.maximum(np.abs(unmasked).max(axis=-1).astype(np.float64), 1e-30)
    if k < choice.shape[1]:
        ranked = -np.sort(-choice, axis=-1)
        gap = ranked[:, k - 1].astype(np.float64) - ranked[:, k]  # -inf past the kept groups: inf
        margin = np.minimum(margin, gap)
    return margin / scale


class DeepSeek2(ReferenceModel):
    def kv_shapes(self) -> list[tuple[int, int, int]]:
        e = self.config.extra
        return [(1, e["kv_lora_rank"] + e["qk_rope"], 0)] * self.config.n_layers  # values are a view of the keys

    def _kv_b(self, il: int) -> tuple[np.ndarray, np.ndarray]:
        """(k_b (H, kv_lora_rank, qk_nope), v_b (H, v_head, kv_lora_rank)) from either layout."""
        e = self.config.extra
        if e["kv_b_split"]:
            return self.w.get(T.blk(il, T.ATTN_K_B)), self.w.get(T.blk(il, T.ATTN_V_B))
        kv = self.w.get(T.blk(il, T.ATTN_KV_B)).reshape(self.config.n_head, e["qk_nope"] + e["v_head_dim"], -1)
        return kv[:, :e["qk_nope"]].transpose(0, 2, 1), kv[:, e["qk_nope"]:]

    def attention(self, il: int, h: np.ndarray, step) -> np.ndarray:
        c, e, n = self.config, self.config.extra, h.shape[0]

        def w(name):
            return self.w.get(T.blk(il, name))

        r, nope, rope = e["kv_lora_rank"], e["qk_nope"], e["qk_rope"]
        if e["q_lora_rank"]:
            q = layers.rmsnorm(layers.linear(h, w(T.ATTN_Q_A)), w(T.ATTN_Q_A_NORM), c.rms_eps)
            q = layers.linear(q, w(T.ATTN_Q_B))
        else:
            q = layers.linear(h, w(T.ATTN_Q))
        q = q.reshape(n, c.n_head, nope + rope)
        kv = layers.linear(h, w(T.ATTN_KV_A_MQA))
        latent = layers.rmsnorm(kv[:, :r], w(T.ATTN_KV_A_NORM), c.rms_eps)
        cos, sin = step.memo.get("deepseek2_rope") or step.memo.setdefault(
            "deepseek2_rope", rope_tables(step.positions, e, c.rope_theta))
        k_pe = layers.rope_pairs(kv[:, None, r:], cos, sin)
        q_pe = layers.rope_pairs(q[..., nope:], cos, sin)
        k_b, v_b = self._kv_b(il)
        q_abs = np.einsum("nhd,hrd->nhr", q[..., :nope], k_b)  # W_k[h]^T q_nope: (n, H, kv_lora_rank)
        cache, s = step.cache, step.start
        keys = cache.k[il]
        keys[s:s + n, 0, :r] = latent
        keys[s:s + n, 0, r:] = k_pe[:, 0]
        t = s + n
        a = layers.attention(np.concatenate([q_abs, q_pe], axis=-1), keys[:t], keys[:t, :, :r], step.allowed,
                             e["kq_scale"])
        o = np.einsum("nhr,hvr->nhv", a.reshape(n, c.n_head, r), v_b).reshape(n, -1)
        return layers.linear(o, w(T.ATTN_OUT))

    def moe(self, il: int, h: np.ndarray) -> np.ndarray:
        e, bias_name = self.config.extra, T.blk(il, T.FFN_EXP_PROBS_B)
        bias = self.w.get(bias_name) if bias_name in self.w else None
        logits = layers.linear(h, self.w.get(T.blk(il, T.FFN_ROUTER)))
        ids, weights = route(logits, e, bias)
        self.note_route_margin(route_margin(logits, e, bias))
        out = blocks.routed_experts(h, ids, weights, blocks.swiglu_expert(self, il))
        if e["n_expert_shared"]:
            out = out + blocks.gated_ffn(self, il, h, gate=T.FFN_GATE_SHEXP, up=T.FFN_UP_SHEXP, down=T.FFN_DOWN_SHEXP)
        return out

    def layer(self, il: int, x: np.ndarray, step) -> np.ndarray:
        c, w = self.config, self.w.get
        x = x + self.attention(il, layers.rmsnorm(x, w(T.blk(il, T.ATTN_NORM)), c.rms_eps), step)
        h = layers.rmsnorm(x, w(T.blk(il, T.FFN_NORM)), c.rms_eps)
        if il < c.extra["n_dense_lead"]:
            return x + blocks.gated_ffn(self, il, h)
        return x + self.moe(il, h)
