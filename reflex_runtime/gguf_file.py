"""Open a GGUF file: header, metadata, tensor directory, and zero-copy views of tensor data.

Pure Python with no numpy, because this runs on the cold path while the CUDA context comes up
in another thread. Every count and length is checked against the bytes that remain before it is
used, so a truncated or hostile file raises ModelFileError (one line) instead of reading out of
bounds, hanging, or allocating more than the file could hold.

Layout (v2/v3, little-endian): magic "GGUF", u32 version, u64 n_tensors, u64 n_kv, then n_kv
(key, type, value) entries, then n_tensors (name, n_dims, dims[n_dims], type, offset) entries,
then padding to `general.alignment`, then the tensor data, each tensor at an aligned offset.
"""

from __future__ import annotations

import array
import mmap
import os
import stat
import struct
from typing import Any, NamedTuple

from .errors import ModelFileError
from .ggml_types import GGML_TYPES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC

SUPPORTED_VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_HEADER = struct.Struct("<IIQQ")
# Scalar value types: id -> (struct, python conversion). Arrays of them become array.array.
_SCALARS = {
    0: struct.Struct("<B"),
    1: struct.Struct("<b"),
    2: struct.Struct("<H"),
    3: struct.Struct("<h"),
    4: struct.Struct("<I"),
    5: struct.Struct("<i"),
    6: struct.Struct("<f"),
    7: struct.Struct("<?"),
    10: struct.Struct("<Q"),
    11: struct.Struct("<q"),
    12: struct.Struct("<d"),
}
_ARRAY_CODES = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "B", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_MAX_ARRAY_NESTING = 4


class TensorInfo(NamedTuple):
    name: str
    shape: tuple[int, ...]  # ggml order: shape[0] is the contiguous (row) dimension
    ggml_type: int
    offset: int  # absolute offset in the file
    nbytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type].name


class _Cursor:
    """Bounds-checked reader over the file buffer."""

    __slots__ = ("buf", "pos", "end", "what")

    def __init__(self, buf, pos: int, end: int):
        self.buf, self.pos, self.end = buf, pos, end
        self.what = "header"

    def need(self, n: int) -> None:
        if n < 0 or self.pos + n > self.end:
            raise ModelFileError(f"GGUF truncated: {self.what} needs {n} bytes at offset {self.pos}, file has {self.end}")

    def u32(self) -> int:
        self.need(4)
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self) -> int:
        self.need(8)
        (v,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return v

    def string(self) -> str:
        n = self.u64()
        self.need(n)
        s = self.buf[self.pos : self.pos + n]
        self.pos += n
        # GGUF strings are UTF-8; keep stray bytes (some vocabularies carry them) losslessly.
        return s.decode("utf-8", "surrogateescape")

    def count(self, n: int, min_item: int, what: str) -> int:
        # A count is believable only if that many items of at least min_item bytes fit in the file.
        if n * min_item > self.end - self.pos:
            raise ModelFileError(f"GGUF {what} count {n} cannot fit in the {self.end - self.pos} bytes left at offset {self.pos}")
        return n


def _read_string_array(cur: _Cursor, n: int) -> list[str]:
    buf, pos, end = cur.buf, cur.pos, cur.end
    unpack = _U64.unpack_from
    out = [""] * n
    for i in range(n):
        if pos + 8 > end:
            cur.pos = pos
            cur.need(8)
        (length,) = unpack(buf, pos)
        pos += 8
        if length > end - pos:
            cur.pos = pos
            cur.need(length)
        out[i] = buf[pos : pos + length].decode("utf-8", "surrogateescape")
        pos += length
    cur.pos = pos
    return out


def _read_value(cur: _Cursor, vtype: int, depth: int = 0) -> Any:
    scalar = _SCALARS.get(vtype)
    if scalar is not None:
        cur.need(scalar.size)
        (v,) = scalar.unpack_from(cur.buf, cur.pos)
        cur.pos += scalar.size
        return v
    if vtype == _STRING:
        return cur.string()
    if vtype == _ARRAY:
        if depth >= _MAX_ARRAY_NESTING:
            raise ModelFileError(f"GGUF array nested deeper than {_MAX_ARRAY_NESTING} at offset {cur.pos}")
        etype = cur.u32()
        n = cur.u64()
        if etype in _SCALARS:
            size = _SCALARS[etype].size
            cur.count(n, size, "array")
            arr = array.array(_ARRAY_CODES[etype])
            arr.frombytes(cur.buf[cur.pos : cur.pos + n * size])
            cur.pos += n * size
            return arr
        if etype == _STRING:
            return _read_string_array(cur, cur.count(n, 8, "string array"))
        if etype == _ARRAY:
            cur.count(n, 12, "nested array")
            return [_read_value(cur, _ARRAY, depth + 1) for _ in range(n)]
        raise ModelFileError(f"GGUF unknown array element type {etype} at offset {cur.pos}")
    raise ModelFileError(f"GGUF unknown metadata value type {vtype} at offset {cur.pos}")


class GGUFFile:
    """A parsed GGUF file backed by a read-only mmap. Use as a context manager or call close()."""

    def __init__(self, path: str | os.PathLike, index: dict | None = None):
        """index: a cached parse of this same file (modelcache.py), which skips the parsing."""
        self.path = os.fspath(path)
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            raise ModelFileError(f"model file not found: {self.path}") from None
        except IsADirectoryError:
            raise ModelFileError(f"model path is a directory, not a GGUF file: {self.path}") from None
        except OSError as e:
            raise ModelFileError(f"cannot open model file {self.path}: {e.strerror}") from None
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise ModelFileError(f"model path is a directory, not a GGUF file: {self.path}")
            if not stat.S_ISREG(st.st_mode):
                raise ModelFileError(f"model path is not a regular file: {self.path}")
            self.size = st.st_size
            if self.size < _HEADER.size:
                raise ModelFileError(f"not a GGUF file (only {self.size} bytes): {self.path}")
            try:
                self._mmap = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as e:
                raise ModelFileError(f"cannot map model file {self.path}: {e}") from None
        finally:
            os.close(fd)
        try:
            if index is not None and self._restore(index):
                return
            self._parse()
        except ModelFileError as e:
            self.close()
            raise ModelFileError(f"{e} ({self.path})") from None
        except (struct.error, MemoryError, OverflowError) as e:  # belt and braces: still one line
            self.close()
            raise ModelFileError(f"malformed GGUF ({type(e).__name__}: {e}): {self.path}") from None

    # -- parsing -------------------------------------------------------------------------

    def _parse(self) -> None:
        buf = self._mmap
        magic, version, n_tensors, n_kv = _HEADER.unpack_from(buf, 0)
        if magic != GGUF_MAGIC:
            raise ModelFileError(f"not a GGUF file (magic {bytes(buf[:4])!r})")
        if version not in SUPPORTED_VERSIONS:
            if struct.unpack("<I", struct.pack(">I", version))[0] in SUPPORTED_VERSIONS:
                raise ModelFileError("big-endian GGUF files are not supported")
            raise ModelFileError(f"unsupported GGUF version {version} (supported: 2, 3)")
        self.version = version
        cur = _Cursor(buf, _HEADER.size, self.size)
        # Each KV needs >= 8 (key len) + 4 (type) + 1 bytes; each tensor >= 8 + 4 + 8 + 4 + 8.
        cur.count(n_kv, 13, "metadata")
        cur.count(n_tensors, 32, "tensor")

        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            cur.what = "metadata key"
            key = cur.string()
            cur.what = f"metadata '{key[:64]}'"
            vtype = cur.u32()
            if key in metadata:
                raise ModelFileError(f"GGUF duplicate metadata key '{key[:64]}'")
            metadata[key] = _read_value(cur, vtype)
        self.metadata = metadata

        alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise ModelFileError(f"GGUF general.alignment must be a power of two, got {alignment!r}")
        self.alignment = alignment

        raw = []
        for _ in range(n_tensors):
            cur.what = "tensor info"
            name = cur.string()
            cur.what = f"tensor '{name[:64]}'"
            n_dims = cur.u32()
            if not 1 <= n_dims <= MAX_DIMS:
                raise ModelFileError(f"tensor '{name[:64]}' has {n_dims} dimensions (1..{MAX_DIMS} allowed)")
            shape = tuple(cur.u64() for _ in range(n_dims))
            ggml_type = cur.u32()
            rel_offset = cur.u64()
            raw.append((name, shape, ggml_type, rel_offset))

        data_start = -(-cur.pos // alignment) * alignment
        if data_start > self.size and n_tensors:
            raise ModelFileError(f"GGUF truncated: tensor data would start at {data_start}, file has {self.size} bytes")
        self.data_offset = data_start
        data_len = self.size - data_start

        tensors: dict[str, TensorInfo] = {}
        for name, shape, ggml_type, rel_offset in raw:
            t = GGML_TYPES.get(ggml_type)
            if t is None:
                raise ModelFileError(f"tensor '{name[:64]}' has unknown ggml type id {ggml_type}")
            n_el = 1
            for d in shape:
                if d <= 0 or d > data_len * t.block_size:
                    raise ModelFileError(f"tensor '{name[:64]}' has impossible dimension {d}")
                n_el *= d
            if shape[0] % t.block_size:
                raise ModelFileError(
                    f"tensor '{name[:64]}' row of {shape[0]} is not a multiple of the {t.name} block size {t.block_size}"
                )
            nbytes = n_el // t.block_size * t.type_size
            if rel_offset % alignment:
                raise ModelFileError(f"tensor '{name[:64]}' offset {rel_offset} is not aligned to {alignment}")
            if rel_offset + nbytes > data_len:
                raise ModelFileError(
                    f"tensor '{name[:64]}' data ({nbytes} bytes at {rel_offset}) runs past the end of the file"
                )
            if name in tensors:
                raise ModelFileError(f"GGUF duplicate tensor name '{name[:64]}'")
            tensors[name] = TensorInfo(name, shape, ggml_type, data_start + rel_offset, nbytes)

        ordered = sorted(tensors.values(), key=lambda ti: ti.offset)
        for a, b in zip(ordered, ordered[1:]):
            if b.offset < a.offset + a.nbytes:
                raise ModelFileError(f"tensors '{a.name[:64]}' and '{b.name[:64]}' overlap in the file")
        self.tensors = tensors

    def _restore(self, index: dict) -> bool:
        """Adopt a cached parse; False (and parse normally) if it does not fit this file."""
        from .modelcache import restore_metadata

        try:
            tensors = {t[0]: TensorInfo(t[0], tuple(t[1]), t[2], t[3], t[4]) for t in index["tensors"]}
            if any(t.offset + t.nbytes > self.size or t.ggml_type not in GGML_TYPES for t in tensors.values()):
                return False
            self.version, self.alignment = index["version"], index["alignment"]
            self.data_offset = index["data_offset"]
            self.metadata = restore_metadata(index["metadata"])
            self.tensors = tensors
            self.from_index = True
            return True
        except (KeyError, TypeError, ValueError, IndexError):
            return False

    # -- access --------------------------------------------------------------------------

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise ModelFileError(f"GGUF has no general.architecture: {self.path}")
        return arch

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def arch_get(self, key: str, default: Any = None) -> Any:
        """`{architecture}.{key}`, e.g. arch_get("block_count")."""
        return self.metadata.get(f"{self.architecture}.{key}", default)

    def tensor(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise ModelFileError(f"GGUF has no tensor '{name}': {self.path}") from None

    def tensor_data(self, name: str) -> memoryview:
        """Zero-copy view of one tensor's bytes in the mapped file."""
        ti = self.tensor(name)
        return memoryview(self._mmap)[ti.offset : ti.offset + ti.nbytes]

    @property
    def buffer(self) -> mmap.mmap:
        return self._mmap

    def close(self) -> None:
        mm = getattr(self, "_mmap", None)
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # views are still alive; the map goes when they do
            self._mmap = None

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GGUFFile({self.path!r}, v{self.version}, {len(self.metadata)} keys, {len(self.tensors)} tensors)"
