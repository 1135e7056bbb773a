"""kernels/scatter.cu: a staging pack's pieces copied from device scratch to their places.

A pack is one host-to-device copy holding several small pieces of the file (gpu/residency.py):
first a header of RxPiece rows (destination, offset in the pack, bytes), then each piece at a
16-byte aligned offset. This module owns that layout; the kernel reads it."""

from __future__ import annotations

import struct
from ctypes import c_int, c_void_p

KERNELS = ("reflex_scatter_pieces",)
PIECE = struct.Struct("<QII")  # RxPiece
ALIGN = 16  # each piece's offset in the pack: the kernel copies 16 bytes a thread where both ends allow
SLICES = 16  # blocks per piece
MAX_PIECES = 64


def header_bytes(n_pieces: int) -> int:
    """Bytes before the first piece: n rows, rounded up to 256."""
    return -(-n_pieces * PIECE.size // 256) * 256


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def pack_bytes(sizes) -> int:
    """The pack's length for pieces of these sizes: header, then each piece aligned."""
    return header_bytes(len(sizes)) + sum(aligned(n) for n in sizes)


def write_header(view, rows) -> None:
    """rows: (destination address, offset in the pack, bytes) per piece, into view[0:]."""
    for i, (dst, at, n) in enumerate(rows):
        PIECE.pack_into(view, i * PIECE.size, dst, at, n)


def scatter(L, pack: int, n_pieces: int) -> None:
    L.go("reflex_scatter_pieces", (n_pieces, SLICES, 1), 256, [c_void_p(pack), c_int(n_pieces)])
