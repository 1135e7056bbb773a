"""kernels/norm.cu: RMS norm (with an optional post-norm residual add), the gated activation
of two products, and an in-place scale."""

from __future__ import annotations

from ctypes import c_float, c_int, c_long, c_void_p

KERNELS = ("reflex_rmsnorm", "reflex_glu", "reflex_scale")


def rmsnorm(L, src: int, w_out: int, out: int, rows: int, n: int, eps: float, resid: int = 0, w_src: int = 0) -> None:
    block = 1024 if n >= 4096 else 256
    L.go("reflex_rmsnorm", rows, block,
         [c_void_p(src), c_void_p(w_src or None), c_void_p(resid or None), c_void_p(w_out), c_void_p(out or None),
          c_int(n), c_float(eps)])


def glu(L, gate: int, up: int, out: int, n: int, act: int) -> None:
    L.go("reflex_glu", (n + 255) // 256, 256, [c_void_p(gate), c_void_p(up), c_void_p(out), c_long(n), c_int(act)])


def scale(L, y: int, n: int, s: float) -> None:
    L.go("reflex_scale", (n + 255) // 256, 256, [c_void_p(y), c_long(n), c_float(s)])
