"""kernels/embed.cu: token embedding rows decoded from their GGUF blocks (times a scale)."""

from __future__ import annotations

from ctypes import c_float, c_int, c_long, c_void_p

from .common import Weight, per_type

KERNELS = per_type("reflex_embed_{}")


def embed(L, table: Weight, tokens: int, out: int, n_tok: int, scale: float) -> None:
    L.go(f"reflex_embed_{table.suffix}", n_tok, 256,
         [c_void_p(table.ptr), c_long(table.row_bytes), c_void_p(tokens), c_void_p(out), c_int(table.k),
          c_int(table.rows), c_float(scale)])
