"""kernels/moe_decode.cu: the routed experts of one decode token with their rows staged in shared
memory (mvs.cu's plan): router logits + softmax top-k in one launch (float routers), and down
summed over the k slots into the residual stream. Gate/up is mvs.cu's reflex_mvs_glu_* (mvs.expert_glu).
A shared expert of the experts' shape rides along as slot k of both (Qwen3.5-MoE)."""

from __future__ import annotations

from ctypes import c_float, c_int, c_long, c_void_p

from .common import Weight, per_type
from .mvs import plan, slot_fits, stage_bytes, stageable

KERNELS = per_type("reflex_moe_mvs_down_{}") + tuple(f"reflex_moe_router_{t}" for t in ("f32", "f16", "bf16"))


def router_topk(L, w: Weight, x: int, norm_w: int, eps: float, logits: int, k: int, normalize: bool, ids: int,
                weights: int, counter: int, also=()) -> bool:
    """One token: router logits (weights staged early) and the top-k in one launch; counter: a
    zeroed int. also: at most one more (Weight, y) product of the same input, type and row length
    (a shared expert's gate), in one more block of the launch. False: not applicable (a quantized
    router, another `also`), nothing launched."""
    if w.type_name not in ("F32", "F16", "BF16") or not stageable(L, [w] + [a for a, _ in also], x, norm_w):
        return False
    p = plan(L, w.rows, w.row_bytes, w.k)
    if p is None or len(also) > 1 or any((a.type_name, a.row_bytes, a.k) != (w.type_name, w.row_bytes, w.k)
                                         or a.rows > p.rb for a, _ in also):
        return False
    w2, y2 = also[0] if also else (None, 0)
    L.go(f"reflex_moe_router_{w.suffix}", -(-w.rows // p.rb) + len(also), 256,
         [c_void_p(w.ptr), c_long(w.row_bytes), c_void_p(x), c_void_p(norm_w or None), c_float(eps),
          c_void_p(logits), c_int(w.rows), c_int(w.k), c_int(p.rb), c_int(p.wpr), c_int(k),
          c_int(int(normalize)), c_void_p(ids), c_void_p(weights), c_void_p(counter),
          c_void_p(w2.ptr if w2 else None), c_void_p(y2 or None), c_int(w2.rows if w2 else 0)], p.smem)
    return True


def down(L, wd: Weight, expert_bytes: int, ids: int, weights: int, k: int, act: int, x: int, n_embd: int,
         early: bool, shared: Weight | None = None, shared_logit: int = 0) -> bool:
    """One token: x += sum_s w[s] down_e act[s]. early: ids and weights were written two or more
    launches back, so the routed rows are staged before the PDL wait. shared: a shared expert's
    down (mvs.slot_fits) as slot k (its activation at act[k]), weighted by sigmoid(*shared_logit)
    (1 without). False: not applicable."""
    if shared and not slot_fits(shared, wd, n_embd):
        return False
    slots = k + bool(shared)
    if not stageable(L, [wd, *([shared] if shared else [])], act, x, expert_bytes):
        return False
    p = plan(L, n_embd, wd.row_bytes, wd.k, ranges=slots, extra=stage_bytes(4 * slots * wd.k))
    if p is None:
        return False
    L.go(f"reflex_moe_mvs_down_{wd.suffix}", -(-n_embd // p.rb), 256,
         [c_void_p(wd.ptr), c_long(wd.row_bytes), c_long(expert_bytes), c_void_p(ids), c_void_p(weights),
          c_int(k), c_void_p(act), c_void_p(x), c_int(n_embd), c_int(wd.k), c_int(p.rb), c_int(p.wpr),
          c_int(int(early)), c_void_p(shared.ptr if shared else None), c_void_p(shared_logit or None)], p.smem)
    return True
