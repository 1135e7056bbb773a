#!/usr/bin/env python3
"""Requantize an f32/f16/bf16 GGUF into Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K or a Q4_K_M-like mix.

    python scripts/quantize_gguf.py IN.gguf OUT.gguf Q4_K_M

Every metadata key is copied exactly (same value types, raw string bytes), except
`general.file_type`, which is set to the scheme's llama_ftype, and `general.quantization_version`,
which is set to 2 if missing. Tensors keep their order; 1-D tensors (norms) stay as they are.

Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 use gguf-py's quantizers (they follow llama.cpp's reference code). gguf-py cannot
write K-quants, so Q4_K, Q5_K and Q6_K are implemented here in numpy (see the block layouts
below); the scale search is a small grid search with a least-squares refit, not llama.cpp's
exact algorithm, but its round-trip error is in the same range (tests/test_quantize.py).

Schemes:
- Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K: every matrix in that type ("pure", like llama-quantize
  --pure), so tests exercise the type in every role, the LM head included.
- Q4_K_M: llama.cpp's Q4_K_M recipe as we understand it: Q4_K for most matrices; Q6_K for the
  output matrix (the token embedding when tied), and for attn_v and ffn_down in the layers that
  get "more bits" (the first eighth, the layers from 7/8 on, and every third layer in between,
  integer division as llama.cpp does). On the embedded Gemma 3 270M Q4_K_M file this choice
  matches llama-quantize's for every tensor (tests/test_quantize.py).
A K-quant needs rows (ne[0]) that are a multiple of 256. Otherwise we fall back the way
llama.cpp does: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0; and an output/tied embedding that
cannot be K-quantized becomes Q8_0. A 32-block type whose row is not a multiple of 32 falls back to F16.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Callable

import numpy as np

QUANTIZER_VERSION = 5  # bump when the bytes it writes change: cached quantized fixtures are rebuilt (5: float32 scale search)
QK_K = 256

# scheme -> llama_ftype written to general.file_type (gguf.LlamaFileType values).
SCHEMES = {
    "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9,
    "Q4_K": 14,  # MOSTLY_Q4_K_S: the closest llama_ftype to "all Q4_K"
    "Q5_K": 16,  # MOSTLY_Q5_K_S
    "Q6_K": 18,  # MOSTLY_Q6_K
    "Q4_K_M": 15,
}
_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
_BLOCK = {"Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32, "Q8_0": 32, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256, "F16": 1, "F32": 1}


# -- K-quant encoders ---------------------------------------------------------------------------
#
# Q4_K block (144 bytes, 256 values = 8 sub-blocks of 32):
#   f16 d | f16 dmin | 12 bytes of 6-bit (scale, min) pairs | 128 bytes of 4-bit q
#   value = d*scale[j]*q - dmin*min[j]
#   scales: bytes 0-3 low 6 bits = scale[0..3], bytes 4-7 low 6 bits = min[0..3],
#   bytes 8-11 = scale[4..7] low nibble | min[4..7] low nibble << 4, and the top two bits of
#   bytes 0-3 / 4-7 hold bits 4-5 of scale[4..7] / min[4..7].
#   q: byte c*32+i holds sub-block 2c element i (low nibble) and sub-block 2c+1 (high nibble).
# Q5_K block (176): d | dmin | 12 scale bytes | 32 bytes qh | 128 bytes ql, q = ql | qh_bit << 4
#   with bit j of qh[i] the high bit of element i of sub-block j.
# Q6_K block (210, 16 sub-blocks of 16): 128 bytes ql | 64 bytes qh | 16 int8 scales | f16 d
#   value = d*scale[s]*(q - 32), q 6 bits. For half h (128 values) and r in 0..127: low 4 bits in
#   ql[64h + r%64] (low nibble if r < 64, else high nibble); high 2 bits in qh[32h + r%32] at bit
#   2*(r//32).


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def _fit_affine(x: np.ndarray, nmax: int, n_grid: int = 15) -> tuple[np.ndarray, np.ndarray]:
    """Per row of x (..., n): scale s >= 0 and min m >= 0 so that x ~ s*q - m, q in [0, nmax].

    Grid over the step size around (max - min)/nmax; for each candidate, round, then refit s and
    m by least squares for those q (m clamped to >= 0, i.e. offsets never positive, as the
    format stores -dmin*min); keep the candidate with the smallest squared error."""
    n = x.shape[-1]
    lo = np.minimum(x.min(axis=-1), 0.0)
    hi = x.max(axis=-1)
    span = hi - lo
    best_err = np.full(x.shape[:-1], np.inf, dtype=np.float32)
    best_s = np.zeros(x.shape[:-1], dtype=np.float32)
    best_m = -lo.astype(np.float32)
    sx = x.sum(axis=-1)
    # float32 grid points: a float64 one upcasts every temporary below (3x slower, same errors)
    for t in np.linspace(-0.6, 0.6, n_grid, dtype=np.float32):
        step = span / (nmax + t)
        inv = np.where(step > 0, 1.0 / np.where(step > 0, step, 1.0), 0.0)
        q = np.clip(np.rint((x - lo[..., None]) * inv[..., None]), 0, nmax)
        sq = q.sum(axis=-1)
        sqq = (q * q).sum(axis=-1)
        sqx = (q * x).sum(axis=-1)
        det = n * sqq - sq * sq
        ok = det > 0
        s = np.where(ok, (n * sqx - sq * sx) / np.where(ok, det, 1.0), 0.0)
        off = np.where(ok, (sx - s * sq) / n, sx / n)  # x ~ s*q + off
        # offsets must be <= 0: otherwise refit the scale alone with off = 0
        pos = off > 0
        s = np.where(pos, np.where(sqq > 0, sqx / np.where(sqq > 0, sqq, 1.0), 0.0), s)
        off = np.where(pos, 0.0, off)
        s = np.maximum(s, 0.0)
        err = ((s[..., None] * q + off[..., None] - x) ** 2).sum(axis=-1)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_s = np.where(better, s, best_s)
        best_m = np.where(better, -off, best_m)
    return best_s.astype(np.float32), best_m.astype(np.float32)


def _quantize_super(values: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """values (nb, k) >= 0 -> (f16-rounded super scale (nb,), integer codes (nb, k) in [0, levels])."""
    vmax = values.max(axis=-1)
    d = _f16(vmax / levels)
    inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1.0), 0.0)
    codes = np.clip(np.rint(values * inv[:, None]), 0, levels).astype(np.uint8)
    return d, codes


def _pack_k_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """(nb, 8) 6-bit scales and mins -> (nb, 12) bytes."""
    out = np.empty((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = (sc[:, :4] & 0x3F) | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = (mn[:, :4] & 0x3F) | ((mn[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    return out


def _k_affine_codes(blocks: np.ndarray, nmax: int):
    """Shared part of Q4_K/Q5_K: (nb, 256) -> d, dmin (f16-rounded), sc, mn (nb, 8), q (nb, 8, 32)."""
    nb = blocks.shape[0]
    x = blocks.reshape(nb, 8, 32)
    s, m = _fit_affine(x, nmax)
    d, sc = _quantize_super(s, 63)
    dmin, mn = _quantize_super(m, 63)
    step = d[:, None] * sc.astype(np.float32)  # (nb, 8)
    off = dmin[:, None] * mn.astype(np.float32)
    inv = np.where(step > 0, 1.0 / np.where(step > 0, step, 1.0), 0.0)
    q = np.clip(np.rint((x + off[..., None]) * inv[..., None]), 0, nmax).astype(np.uint8)
    return d, dmin, sc, mn, q


def quantize_q4_k(rows: np.ndarray) -> np.ndarray:
    blocks = rows.reshape(-1, QK_K).astype(np.float32)
    d, dmin, sc, mn, q = _k_affine_codes(blocks, 15)
    nb = blocks.shape[0]
    qs = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(nb, 128)
    out = np.concatenate([
        d.astype(np.float16).view(np.uint8).reshape(nb, 2),
        dmin.astype(np.float16).view(np.uint8).reshape(nb, 2),
        _pack_k_scales(sc, mn), qs,
    ], axis=1)
    return out.reshape(*rows.shape[:-1], rows.shape[-1] // QK_K * 144)


def quantize_q5_k(rows: np.ndarray) -> np.ndarray:
    blocks = rows.reshape(-1, QK_K).astype(np.float32)
    d, dmin, sc, mn, q = _k_affine_codes(blocks, 31)
    nb = blocks.shape[0]
    lo = q & 0x0F
    qs = (lo[:, 0::2, :] | (lo[:, 1::2, :] << 4)).reshape(nb, 128)
    hi = (q >> 4) & 1  # (nb, 8, 32): bit j of qh[i] = hi[:, j, i]
    qh = (hi << np.arange(8, dtype=np.uint8)[None, :, None]).sum(axis=1, dtype=np.uint16).astype(np.uint8)
    out = np.concatenate([
        d.astype(np.float16).view(np.uint8).reshape(nb, 2),
        dmin.astype(np.float16).view(np.uint8).reshape(nb, 2),
        _pack_k_scales(sc, mn), qh, qs,
    ], axis=1)
    return out.reshape(*rows.shape[:-1], rows.shape[-1] // QK_K * 176)


def _fit_symmetric(x: np.ndarray, n_grid: int = 13) -> np.ndarray:
    """Per row of x (..., n): signed scale s so that x ~ s*q, q in [-32, 31]. The element of
    largest magnitude is mapped near -32 (the longer side of the range), then the grid varies
    that target, rounds, refits s by least squares and keeps the smallest squared error."""
    idx = np.abs(x).argmax(axis=-1)
    extreme = np.take_along_axis(x, idx[..., None], axis=-1)[..., 0]
    best_err = np.full(x.shape[:-1], np.inf, dtype=np.float32)
    best_s = np.zeros(x.shape[:-1], dtype=np.float32)
    for target in np.linspace(-32.5, -29.5, n_grid, dtype=np.float32):  # float32: see _fit_affine
        s0 = extreme / target
        inv = np.where(s0 != 0, 1.0 / np.where(s0 != 0, s0, 1.0), 0.0)
        q = np.clip(np.rint(x * inv[..., None]), -32, 31)
        sqq = (q * q).sum(axis=-1)
        s = np.where(sqq > 0, (q * x).sum(axis=-1) / np.where(sqq > 0, sqq, 1.0), 0.0)
        err = ((s[..., None] * q - x) ** 2).sum(axis=-1)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_s = np.where(better, s, best_s)
    return best_s.astype(np.float32)


def quantize_q6_k(rows: np.ndarray) -> np.ndarray:
    blocks = rows.reshape(-1, QK_K).astype(np.float32)
    nb = blocks.shape[0]
    x = blocks.reshape(nb, 16, 16)
    s = _fit_symmetric(x)  # (nb, 16), signed
    amax = np.abs(s).max(axis=-1)
    d = _f16(amax / 127.0)
    inv_d = np.where(d > 0, 1.0 / np.where(d > 0, d, 1.0), 0.0)
    sc = np.clip(np.rint(s * inv_d[:, None]), -127, 127).astype(np.int8)
    step = d[:, None] * sc.astype(np.float32)
    inv = np.where(step != 0, 1.0 / np.where(step != 0, step, 1.0), 0.0)
    q = (np.clip(np.rint(x * inv[..., None]), -32, 31) + 32).astype(np.uint8).reshape(nb, 2, 128)
    ql = np.empty((nb, 2, 64), dtype=np.uint8)
    ql[:] = (q[:, :, :64] & 0x0F) | ((q[:, :, 64:] & 0x0F) << 4)
    hi = (q >> 4).reshape(nb, 2, 4, 32)  # [h, r // 32, r % 32]
    qh = (hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)).astype(np.uint8)
    out = np.concatenate([
        ql.reshape(nb, 128), qh.reshape(nb, 64), sc.view(np.uint8),
        d.astype(np.float16).view(np.uint8).reshape(nb, 2),
    ], axis=1)
    return out.reshape(*rows.shape[:-1], rows.shape[-1] // QK_K * 210)


def _chunked(fn: Callable[[np.ndarray], np.ndarray], rows_per_chunk: int = 1024):
    """Bound the temporaries: quantize a big matrix a few rows at a time."""

    def run(arr: np.ndarray) -> np.ndarray:
        rows = arr.reshape(-1, arr.shape[-1])
        parts = [fn(rows[i:i + rows_per_chunk]) for i in range(0, rows.shape[0], rows_per_chunk)]
        out = np.concatenate(parts, axis=0)
        return out.reshape(*arr.shape[:-1], out.shape[-1])

    return run


def quantize_array(data: np.ndarray, type_name: str) -> np.ndarray:
    """f32 array (..., row) -> the ggml bytes (..., row_bytes) of type_name (F32/F16 as floats)."""
    import gguf

    data = np.ascontiguousarray(data, dtype=np.float32)
    if type_name == "F32":
        return data
    if type_name == "F16":
        return data.astype(np.float16)
    if type_name in ("Q4_K", "Q5_K", "Q6_K"):
        fn = {"Q4_K": quantize_q4_k, "Q5_K": quantize_q5_k, "Q6_K": quantize_q6_k}[type_name]
        return _chunked(fn, max(1, (1 << 20) // data.shape[-1]))(data)
    return gguf.quants.quantize(data, gguf.GGMLQuantizationType[type_name])


# -- per-tensor type choice ----------------------------------------------------------------------

_LAYER = re.compile(r"^blk\.(\d+)\.")


def _more_bits(layer: int, n_layers: int) -> bool:
    """Layers that get a bigger type in the *_M mixes: the first and last eighth, and every
    third layer in between."""
    eighth = n_layers // 8
    return layer < eighth or layer >= (7 * n_layers) // 8 or (layer - eighth) % 3 == 2


# llama-quantize never quantizes these (llama-quant.cpp): the MoE routers (including the shared
# expert's gate) and the Gated DeltaNet convolution; real files keep them in their source type.
_NEVER_QUANTIZED = ("ffn_gate_inp", "ssm_conv1d")


def choose_type(name: str, shape: tuple[int, ...], scheme: str, n_layers: int, tied: bool) -> tuple[str, str | None]:
    """(ggml type name, note) for one tensor; shape in ggml order (shape[0] = row length).
    The note says why a tensor did not get the scheme's base type."""
    if len(shape) < 2:
        return "F32", None
    if any(k in name for k in _NEVER_QUANTIZED):
        return "F32", "kept in F32 as llama-quantize keeps it (expert routers, the SSM convolution)"
    row = shape[0]
    is_output = name == "output.weight" or (tied and name == "token_embd.weight")
    if scheme == "Q4_K_M":
        want = "Q4_K"
        m = _LAYER.match(name)
        if is_output:
            want = "Q6_K"
        elif m and (".attn_v." in name or ".ffn_down" in name) and _more_bits(int(m.group(1)), n_layers):
            want = "Q6_K"
    else:
        want = scheme
    if row % _BLOCK[want] == 0:
        return want, (None if want == (scheme if scheme != "Q4_K_M" else "Q4_K") else f"{want} by the {scheme} recipe")
    if is_output and scheme == "Q4_K_M":
        got = "Q8_0"
    else:
        got = _FALLBACK.get(want, want)
    if row % _BLOCK[got]:
        got = "F16"
    return got, f"row of {row} is not a multiple of {_BLOCK[want]}: {want} -> {got}"


# -- file rewrite --------------------------------------------------------------------------------
#
# gguf-py's GGUFReader takes ~15 s to parse a 151k-token vocabulary (one numpy memmap view per
# string), so the source is read by the small typed parser below: every metadata value with its
# GGUF value type (strings as raw bytes), so the writer can reproduce it exactly.

_SCALAR_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NP_DTYPE = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8", 12: "<f8"}


class SourceGGUF:
    """metadata: list of (key, value type, array element type or None, value); tensors: list of
    (name, ggml shape, ggml type id, absolute offset)."""

    def __init__(self, path: str | Path):
        import mmap
        import struct

        with open(path, "rb") as f:
            self.buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        buf = self.buf
        magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
        if magic != b"GGUF" or version not in (2, 3):
            raise ValueError(f"{path}: not a little-endian GGUF v2/v3 file")
        self.pos = 24
        self.metadata = []
        for _ in range(n_kv):
            key = self._str().decode("utf-8")
            vtype = self._u32()
            if vtype == 9:
                etype, n = self._u32(), self._u64()
                if etype == 8:
                    value = [self._str() for _ in range(n)]
                elif etype in _NP_DTYPE:
                    dt = np.dtype(_NP_DTYPE[etype])
                    value = np.frombuffer(buf, dtype=dt, count=n, offset=self.pos).tolist()
                    if etype == 7:
                        value = [bool(v) for v in value]
                    self.pos += n * dt.itemsize
                else:
                    raise NotImplementedError(f"metadata '{key}': nested arrays are not supported")
                self.metadata.append((key, vtype, etype, value))
            elif vtype == 8:
                self.metadata.append((key, vtype, None, self._str()))
            else:
                fmt = _SCALAR_FMT[vtype]
                (value,) = struct.unpack_from(fmt, buf, self.pos)
                self.pos += struct.calcsize(fmt)
                self.metadata.append((key, vtype, None, value))
        raw = []
        for _ in range(n_tensors):
            name = self._str().decode("utf-8")
            n_dims = self._u32()
            shape = tuple(self._u64() for _ in range(n_dims))
            raw.append((name, shape, self._u32(), self._u64()))
        align = next((v for k, _, _, v in self.metadata if k == "general.alignment"), 32)
        data_start = -(-self.pos // align) * align
        self.tensors = [(name, shape, t, data_start + off) for name, shape, t, off in raw]

    def _u32(self) -> int:
        (v,) = np.frombuffer(self.buf, dtype="<u4", count=1, offset=self.pos)
        self.pos += 4
        return int(v)

    def _u64(self) -> int:
        (v,) = np.frombuffer(self.buf, dtype="<u8", count=1, offset=self.pos)
        self.pos += 8
        return int(v)

    def _str(self) -> bytes:
        n = self._u64()
        s = self.buf[self.pos:self.pos + n]
        self.pos += n
        return s

    def get(self, key: str, default=None):
        return next((v for k, _, _, v in self.metadata if k == key), default)

    def tensor_bytes(self, shape: tuple[int, ...], type_id: int, offset: int) -> np.ndarray:
        """(rows, row_bytes) uint8 view of one tensor."""
        import gguf

        block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(type_id)]
        row_bytes = shape[0] // block * type_size
        n_rows = 1
        for d in shape[1:]:
            n_rows *= d
        return np.frombuffer(self.buf, dtype=np.uint8, count=n_rows * row_bytes, offset=offset).reshape(n_rows, row_bytes)


def copy_metadata(src: SourceGGUF, writer, file_type: int) -> None:
    from gguf import GGUFValueType

    for key, vtype, etype, value in src.metadata:
        if key in ("general.architecture", "general.file_type"):
            continue  # the writer adds the architecture itself; file_type is set below
        if key == "general.alignment":
            writer.add_custom_alignment(int(value))
            continue
        writer.add_key_value(key, value, GGUFValueType(vtype), sub_type=None if etype is None else GGUFValueType(etype))
    writer.add_key_value("general.file_type", file_type, GGUFValueType.UINT32)
    if src.get("general.quantization_version") is None:
        writer.add_key_value("general.quantization_version", 2, GGUFValueType.UINT32)


_WORKER_SOURCE: dict = {}


def _quantize_tensor(job: tuple) -> tuple[str, str, str | None, np.ndarray]:
    """One tensor: dequantize from the source file, pick its type, quantize. Runs in workers."""
    import gguf

    src, name, shape, type_id, offset, scheme, n_layers, tied = job
    source = _WORKER_SOURCE.get(src)
    if source is None:
        source = _WORKER_SOURCE[src] = SourceGGUF(src)
    src_type = gguf.GGMLQuantizationType(type_id)
    values = gguf.quants.dequantize(source.tensor_bytes(shape, type_id, offset), src_type)
    values = values.reshape(tuple(reversed(shape))).astype(np.float32, copy=False)
    if len(shape) < 2:
        type_name, note = ("F16" if src_type == gguf.GGMLQuantizationType.F16 else "F32"), None
    else:
        type_name, note = choose_type(name, shape, scheme, n_layers, tied)
    return name, type_name, note, quantize_array(values, type_name)


def quantize_file(src: str | Path, dst: str | Path, scheme: str, log: Callable[[str], None] | None = print,
                  jobs: int | None = None) -> dict[str, str]:
    """Write dst with every matrix of src requantized per `scheme`; returns {tensor: type}.
    Tensors are quantized in `jobs` processes (default: up to 8 when the file is large), which
    makes a 0.6B-parameter Q4_K_M file take seconds instead of minutes."""
    import os

    import gguf

    scheme = scheme.upper()
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme}; known: {', '.join(SCHEMES)}")
    # The per-process sources are keyed by path: a new file at an old path (a test's reused temp
    # folder) must not be read through the old one's parsed header.
    _WORKER_SOURCE.clear()
    source = SourceGGUF(src)
    arch = source.get("general.architecture").decode()
    n_layers = int(source.get(f"{arch}.block_count", 0))
    tied = all(name != "output.weight" for name, *_ in source.tensors)
    writer = gguf.GGUFWriter(str(dst), arch)
    copy_metadata(source, writer, SCHEMES[scheme])
    chosen: dict[str, str] = {}
    float_types = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16)
    for name, shape, type_id, offset in source.tensors:
        if gguf.GGMLQuantizationType(type_id) not in float_types and log:
            log(f"warning: {name} is {gguf.GGMLQuantizationType(type_id).name} already; dequantizing and requantizing loses precision")
    work = [(str(src), name, shape, type_id, offset, scheme, n_layers, tied) for name, shape, type_id, offset in source.tensors]
    if jobs is None:
        jobs = min(8, os.cpu_count() or 1) if os.path.getsize(src) > (256 << 20) else 1
    if jobs > 1:
        import multiprocessing

        pool = multiprocessing.get_context("fork").Pool(jobs)
        results = pool.imap(_quantize_tensor, work)  # in order: the writer needs file order
    else:
        pool, results = None, map(_quantize_tensor, work)
    try:
        for name, type_name, note, data in results:
            if note and log:
                log(f"{name}: {note}")
            chosen[name] = type_name
            if type_name in ("F32", "F16"):
                writer.add_tensor(name, np.ascontiguousarray(data))
            else:
                writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=gguf.GGMLQuantizationType[type_name])
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return chosen


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Requantize an f32/f16 GGUF (see the module docstring).")
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("scheme", type=str.upper, choices=sorted(SCHEMES))
    args = ap.parse_args(argv)
    chosen = quantize_file(args.src, args.dst, args.scheme)
    counts: dict[str, int] = {}
    for t in chosen.values():
        counts[t] = counts.get(t, 0) + 1
    print(f"{args.dst}: {len(chosen)} tensors, " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
