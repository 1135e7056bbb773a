"""kernels/logits.cu: log-probabilities of chosen (row, token) pairs (system1), logit
soft-capping, and `reflex smoke`'s known-answer kernel."""

from __future__ import annotations

from ctypes import c_float, c_int, c_long, c_void_p

KERNELS = ("reflex_logprob_rows", "reflex_softcap", "reflex_smoke_axpb")


def logprob_rows(L, logits: int, n_vocab: int, rows: int, tokens: int, out: int, n: int) -> None:
    L.go("reflex_logprob_rows", n, 1024, [c_void_p(logits), c_int(n_vocab), c_void_p(rows), c_void_p(tokens),
                                           c_void_p(out)])


def softcap(L, y: int, n: int, cap: float) -> None:
    L.go("reflex_softcap", (n + 255) // 256, 256, [c_void_p(y), c_long(n), c_float(cap)])


def smoke_axpb(L, x: int, y: int, n: int, a: float, b: float) -> None:
    """y = a x + b over n floats."""
    L.go("reflex_smoke_axpb", ((n + 127) // 128, 1, 1), 128, [c_void_p(x), c_void_p(y), c_int(n), c_float(a),
                                                             c_float(b)])
