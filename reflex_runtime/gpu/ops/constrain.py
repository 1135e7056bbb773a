"""kernels/constrain.cu: logprobs and grammar masks (gpu/constrained.py): per slice of a logit
row its max, sum of exp and top k; forbidden logits to -inf; the chosen token's logit."""

from __future__ import annotations

from ctypes import c_int, c_void_p

KERNELS = ("reflex_logit_stats", "reflex_mask_logits", "reflex_token_logit")
STATS_TOPK = 20  # RX_TOPK_MAX, OpenAI's top_logprobs limit (sampling.MAX_TOP_LOGPROBS)
STATS_PARTS = 64  # slices of the row: enough blocks to read 150k-256k logits at full bandwidth


def logit_stats(L, logits: int, n: int, k: int, part_f: int, part_i: int, n_part: int) -> None:
    """Per slice of the row: max, sum of exp(x - max), the k largest (value, id); part_f holds
    (2 + STATS_TOPK) floats and part_i STATS_TOPK ints per slice (gpu/constrained.py merges them)."""
    L.go("reflex_logit_stats", n_part, 256, [c_void_p(logits), c_int(n), c_int(k), c_void_p(part_f), c_void_p(part_i)])


def mask_logits(L, logits: int, words: int, n: int) -> None:
    L.go("reflex_mask_logits", (n + 255) // 256, 256, [c_void_p(logits), c_void_p(words), c_int(n)])


def token_logit(L, logits: int, tokens: int, out: int) -> None:
    L.go("reflex_token_logit", 1, 32, [c_void_p(logits), c_void_p(tokens), c_void_p(out)])
