"""Qwen3-MoE in numpy (the layer diagram, routing rule and llama.cpp's conventions are in
reflex_runtime/models/qwen3moe.py)."""

from __future__ import annotations

import numpy as np

from . import ops
from .qwen3 import Qwen3

_F32 = np.float32
# llama.cpp clamps the sum of the selected weights to the smallest normal f16 before dividing.
_MIN_WEIGHT_SUM = _F32(6.103515625e-5)


def route(logits: np.ndarray, k: int, normalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """Router logits (n, n_expert) -> (expert ids (n, k) int64, weights (n, k) float32).

    p = softmax(logits) in float32; the k largest p are taken in decreasing order, equal p in
    increasing expert id (a stable sort), so ties go to the lower expert id; with `normalize` the
    k weights are divided by their sum (clamped to >= 2^-14)."""
    z = logits.astype(_F32, copy=False)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    p = (e / e.sum(axis=-1, keepdims=True)).astype(_F32, copy=False)
    ids = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    w = np.take_along_axis(p, ids, axis=-1)
    if normalize:
        w = w / np.maximum(w.sum(axis=-1, keepdims=True), _MIN_WEIGHT_SUM)
    return ids, w.astype(_F32, copy=False)


class Qwen3Moe(Qwen3):
    """Qwen3's attention block; the FFN is the routed experts."""

    def ffn(self, il: int, h: np.ndarray) -> np.ndarray:
        return self.moe(il, h)

    def moe(self, il: int, h: np.ndarray) -> np.ndarray:
        """The sparse FFN: route each token, run each chosen expert on its tokens, sum weighted.
        A token's expert outputs are added in increasing expert id."""
        e = self.config.extra
        p = f"blk.{il}."
        ids, weights = route(ops.linear(h, self.w.get(p + "ffn_gate_inp.weight")), e["n_expert_used"],
                             e["norm_topk_prob"])
        out = np.zeros_like(h)
        for xid in np.unique(ids):
            rows, slot = np.nonzero(ids == xid)  # each token picks an expert at most once
            hx = h[rows]
            gate = ops.linear(hx, self.expert(p + "ffn_gate_exps.weight", xid))
            up = ops.linear(hx, self.expert(p + "ffn_up_exps.weight", xid))
            y = ops.linear(ops.swiglu(gate, up), self.expert(p + "ffn_down_exps.weight", xid))
            out[rows] += y * weights[rows, slot][:, None]
        return out

    def expert(self, name: str, xid: int) -> np.ndarray:
        """Expert xid's (out, in) matrix of a stacked expert tensor. Without kept weights only
        that expert's rows are dequantized (a real MoE file holds far more experts than a
        forward uses)."""
        if self.w.keep:
            return self.w.get(name)[xid]
        raw, qtype, shape = self.w._raw(name)  # raw: (n_expert * out, row_bytes)
        n_out = shape[1]
        block = raw[xid * n_out:(xid + 1) * n_out]
        arr = self.w._gguf_py.quants.dequantize(np.ascontiguousarray(block), qtype)
        return np.asarray(arr, dtype=_F32).reshape(shape[1:])
