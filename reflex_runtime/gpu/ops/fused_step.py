"""kernels/fused_step.cu: a dense model's whole decode step as one persistent kernel running a
program of ops (kernels/fused_step.cuh, mirrored here); gpu/fused.py builds the program from the
model's blocks. `layout()` sizes its shared memory, `launch()` enqueues it."""

from __future__ import annotations

from ctypes import Structure, Union, c_float, c_int, c_long, c_void_p, sizeof
from dataclasses import dataclass

from .attn_decode import AtdArgs
from .attn_decode import smem_bytes as attn_smem
from .mvs import MVS_NX, stage_bytes

KERNELS = ("reflex_fused_step",)
THREADS = 256  # FS_THREADS
X_EARLY, LOOKAHEAD, ATTN_EARLY = 1, 2, 4  # the kernel's flags (FS_X_EARLY, FS_LOOKAHEAD, FS_ATTN_EARLY)
STATIC_SMEM = 8 * 1024  # the kernel's static shared memory (4.4 KB on sm_90) and headroom
EMBED, MV, GLU, ATTN, NORM, HEAD = range(6)  # FS_* op kinds


class FsPick(Structure):
    _fields_ = [("part_v", c_void_p), ("part_i", c_void_p), ("counter", c_void_p), ("st", c_void_p * 6),
                ("last", c_int)]


class FsMv(Structure):
    _fields_ = [("w", c_void_p * 3), ("y", c_void_p * 3), ("row_bytes", c_long * 3), ("rows", c_int * 3),
                ("type", c_int * 3), ("n_w", c_int), ("K", c_int), ("rb", c_int), ("wpr", c_int),
                ("accumulate", c_int), ("act", c_int), ("x", c_void_p), ("norm_w", c_void_p), ("eps", c_float),
                ("pick", FsPick), ("post_src", c_void_p), ("post_w_src", c_void_p), ("post_resid", c_void_p),
                ("post_resid_out", c_void_p)]


class FsNorm(Structure):
    _fields_ = [("src", c_void_p), ("w_src", c_void_p), ("resid", c_void_p), ("w_out", c_void_p), ("out", c_void_p),
                ("n", c_int), ("eps", c_float)]


class FsEmbed(Structure):
    _fields_ = [("table", c_void_p), ("row_bytes", c_long), ("tokens", c_void_p), ("out", c_void_p),
                ("n_embd", c_int), ("n_vocab", c_int), ("type", c_int), ("scale", c_float)]


class FsAttn(Structure):
    _fields_ = [("a", AtdArgs), ("max_split", c_int), ("n_hg", c_int)]


class FsU(Union):
    _fields_ = [("mv", FsMv), ("attn", FsAttn), ("norm", FsNorm), ("embed", FsEmbed)]


class FsOp(Structure):
    _fields_ = [("kind", c_int), ("u", FsU)]


OP_BYTES = sizeof(FsOp)


def wpr_of(k: int) -> int | None:
    """Warps per row for rows of k weights (mvs.plan's rule); None past 8."""
    wpr = 1
    while k > 8 * 32 * MVS_NX * wpr:
        wpr *= 2
    return wpr if wpr <= 8 and k % 8 == 0 else None


@dataclass(frozen=True)
class Layout:
    """The kernel's dynamic shared memory: two tile buffers, the row partial sums, the attention's
    working memory, the program's copy, then (FS_X_EARLY, or post-norms folded into matrix ops) x
    and two norm-weight slots (FS_X_EARLY's)."""

    buf_bytes: int
    red_off: int
    attn_off: int
    prog_off: int
    smem: int
    xs_off: int = 0
    nw_off: int = 0
    nw_bytes: int = 0


def layout(max_shared: int, attn_bytes: int, red_floats: int, n_ops: int, x_floats: int = 0,
           nw_floats: int = 0) -> Layout | None:
    """The largest tile buffers that fit beside the rest (None: too small to be worth it).
    x_floats / nw_floats: the longest input (FS_X_EARLY, folded post-norms) and norm-weight vector
    (FS_X_EARLY) of a matrix op; 0: no x region."""
    red, prog = _up16(4 * red_floats), _up16(n_ops * OP_BYTES + 16)
    xs = _up16(4 * x_floats)
    nw = _up16(4 * nw_floats + 16) if x_floats else 0  # + 16: a hull copy keeps the address mod 16
    buf = (max_shared - STATIC_SMEM - attn_bytes - red - prog - xs - 2 * nw) // 2 // 32 * 32  # halves 16-aligned
    if buf < 16 * 1024:
        return None
    attn_off = 2 * buf + red
    prog_off = _up16(attn_off + attn_bytes)
    xs_off = prog_off + prog
    if not x_floats:
        return Layout(buf, 2 * buf, attn_off, prog_off, xs_off)
    return Layout(buf, 2 * buf, attn_off, prog_off, xs_off + xs + 2 * nw, xs_off, xs_off + xs, nw)


def _up16(n: int) -> int:
    return (n + 15) // 16 * 16


def tile_rows(rows: int, row_bytes: int, ranges: int, buf_bytes: int, grid: int) -> int:
    """Rows per tile: spread over the grid, each tile's `ranges` runs within the buffer (a run
    in each half for two); 0 when one row does not fit."""
    cap = (buf_bytes // ranges - 45) // row_bytes  # stage_bytes(n) <= n + 45
    if cap < 1:
        return 0
    return min(-(-rows // grid), cap)


def attn_bytes(group: int, hd: int, hd_v: int) -> int:
    return attn_smem(group, hd, hd_v)


def launch(L, ops_ptr: int, n_ops: int, bar: int, lay: Layout, grid: int, stamps: int = 0, flags: int = 0) -> None:
    """One step of the program at ops_ptr (device memory); stamps: 4 n_ops zeroed u64 for a profile;
    flags: X_EARLY (needs a layout with x_floats) | LOOKAHEAD | ATTN_EARLY (needs programs built with it:
    their attention ops' `prefetch` set)."""
    assert not flags & X_EARLY or lay.xs_off, "FS_X_EARLY without its shared memory"
    L.go("reflex_fused_step", grid, THREADS,
         [c_void_p(ops_ptr), c_int(n_ops), c_void_p(bar), c_int(lay.buf_bytes), c_int(lay.red_off),
          c_int(lay.attn_off), c_int(lay.prog_off), c_void_p(stamps or None), c_int(lay.xs_off), c_int(lay.nw_off),
          c_int(lay.nw_bytes), c_int(flags)], lay.smem, cooperative=True)
