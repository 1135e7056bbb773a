"""kernels/moe_route.cu: DeepSeek-V2/V3 routing: softmax or sigmoid (+ exp_probs_b), optionally
group-limited, top-k, normalized and scaled, into the (id, weight) pairs of moe.cu's kernels."""

from __future__ import annotations

from ctypes import c_float, c_int, c_void_p

KERNELS = ("reflex_moe_route",)
MAX_GROUPS = 64  # ROUTE_MAX_GROUPS


def route(L, logits: int, bias: int, n_tok: int, n_expert: int, k: int, sigmoid: bool, n_group: int, n_group_used: int,
          group_top2: bool, normalize: bool, scale: float, ids: int, weights: int) -> None:
    """ids/weights (n_tok x k) from router logits."""
    L.go("reflex_moe_route", n_tok, 256,
         [c_void_p(logits), c_void_p(bias or None), c_int(n_expert), c_int(k), c_int(int(sigmoid)),
          c_int(n_group), c_int(n_group_used), c_int(int(group_top2)), c_int(int(normalize)), c_float(scale),
          c_void_p(ids), c_void_p(weights)])
