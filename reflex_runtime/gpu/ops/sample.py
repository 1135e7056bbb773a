"""kernels/sample.cu: the greedy pick (argmax over the logits in two launches) and the sampler,
both advancing the device-side decode state (kernels/state.cuh RxState)."""

from __future__ import annotations

import ctypes
from ctypes import c_int, c_void_p

KERNELS = ("reflex_argmax_partial", "reflex_argmax_final", "reflex_sample", "reflex_pick_rows")
ARGMAX_PARTS = 128  # blocks of reflex_argmax_partial


class RxState(ctypes.Structure):
    """Mirror of kernels/state.cuh's RxState: device pointers to the decode bookkeeping."""

    _fields_ = [("tokens", ctypes.c_void_p), ("pos", ctypes.c_void_p), ("slot", ctypes.c_void_p),
                ("n_kv", ctypes.c_void_p), ("step", ctypes.c_void_p), ("out_tokens", ctypes.c_void_p)]


class RxRows(ctypes.Structure):
    """Mirror of kernels/sample.cu's RxRows: a batch of sequences' decode state, one int per row."""

    _fields_ = [("tokens", ctypes.c_void_p), ("pos", ctypes.c_void_p), ("slot", ctypes.c_void_p),
                ("steps", ctypes.c_void_p)]


class RxSampling(ctypes.Structure):
    """Mirror of kernels/sample.cu's RxSampling (device memory, read by the sampler each step)."""

    _fields_ = [("temperature", ctypes.c_float), ("top_k", ctypes.c_int), ("top_p", ctypes.c_float),
                ("min_p", ctypes.c_float), ("seed", ctypes.c_ulonglong)]


def argmax(L, logits: int, n: int, part_v: int, part_i: int, n_part: int, state, last: int) -> None:
    L.go("reflex_argmax_partial", n_part, 1024, [c_void_p(logits), c_int(n), c_void_p(part_v), c_void_p(part_i)])
    L.go("reflex_argmax_final", 1, 32, [c_void_p(part_v), c_void_p(part_i), c_int(n_part), state, c_int(last)])


def sample(L, logits: int, n: int, sampling_ptr: int, state, last: int) -> None:
    L.go("reflex_sample", 1, 1024, [c_void_p(logits), c_int(n), c_void_p(sampling_ptr), state, c_int(last)])


def pick_rows(L, logits: int, n: int, sampling_rows: int, rows: RxRows, n_rows: int) -> None:
    """Every row's pick (greedy or sampled by its own RxSampling in sampling_rows[r]), then the
    row's state one token further (see reflex_pick_rows)."""
    L.go("reflex_pick_rows", n_rows, 1024, [c_void_p(logits), c_int(n), c_void_p(sampling_rows), rows])
