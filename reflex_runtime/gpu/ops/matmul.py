"""kernels/matmul.cu: matrix products of many tokens on WMMA tensor-core tiles (64 tokens x 128
rows), the prompt path of GPUs older than sm_80 (newer ones take gemm.cu)."""

from __future__ import annotations

from ctypes import c_int, c_long, c_void_p

from .common import Weight, per_type

KERNELS = per_type("reflex_mm_{}")


def mm(L, w: Weight, x: int, y: int, n_tok: int, accumulate: bool = False, x_stride: int = 0) -> None:
    """y[t] (+)= W x[t] for n_tok tokens. Needs K % 64 == 0."""
    assert w.k % 64 == 0
    L.go(f"reflex_mm_{w.suffix}", ((w.rows + 127) // 128, (n_tok + 63) // 64, 1), 256,
         [c_void_p(w.ptr), c_long(w.row_bytes), c_void_p(x), c_int(x_stride or w.k), c_void_p(y), c_int(w.rows),
          c_int(w.rows), c_int(w.k), c_int(n_tok), c_int(int(accumulate))])
