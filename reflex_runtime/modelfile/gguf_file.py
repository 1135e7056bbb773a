"""Open a GGUF file: header, metadata, tensor directory, and zero-copy views of tensor data.

Pure Python with no numpy, because this runs on the cold path while the CUDA context comes up
in another thread. Every count and length is checked before it is used: against the bytes that
remain (a truncated file), and against what a real model needs (the bounds below), so a
truncated or hostile file raises ModelFileError (one line) instead of reading out of bounds,
hanging, or allocating more than the bounds allow. docs/INTERNALS.md states the bounds and the
memory they allow.

Memory: the metadata becomes Python objects whose size is charged, before they are made, against
METADATA_BUDGET at a conservative per-object cost (a string of b UTF-8 bytes costs at most
4 b + 80 bytes as a str, whatever its characters), so a file of millions of tiny keys or strings
is refused instead of growing the process by gigabytes. Tensor data is never read through the
mapping by the runtime: `read_tensor` copies it with pread (a file truncated under a running
process then gives a ModelFileError, not a SIGBUS), and `release_mapping()` drops the map once
the header is parsed and nothing else needs it. (The opt-in REFLEX_UPLOAD_MAPPED=1 upload reads the
weights through a mapping of its own while they load: gpu/upload.py MappedFile says what that risks.)

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

from ..errors import ModelFileError
from .ggml_types import GGML_TYPES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC

SUPPORTED_VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS

# Bounds: what the largest real models need, with room (real figures in brackets).
MAX_KV = 1 << 14  # metadata keys [< 100]
MAX_KEY_BYTES = (1 << 16) - 1  # one key's name (the GGUF spec's limit) [< 64]
MAX_STRING_BYTES = 1 << 24  # one string value, 16 MiB [chat templates: tens of KB]
MAX_ARRAY = 1 << 21  # elements of one array [vocabularies <= 262,144 tokens, ~500k merges]
MAX_TENSORS = 1 << 16  # tensor infos [DeepSeek-V3: ~1,100; unfused-expert MoE files: ~10^4]
MAX_TENSOR_NAME_BYTES = 63  # llama.cpp refuses names of GGML_MAX_NAME (64) bytes or more
METADATA_BUDGET = 256 << 20  # bytes the metadata may cost as Python objects [Qwen3: ~45 MiB]
# Conservative per-object costs (CPython, 64-bit) charged against METADATA_BUDGET:
_STR_COST = 104  # a str's header (<= 80) + allocator rounding + its list slot; plus 4 per byte
_KEY_COST = 232  # the key's str + a dict entry with growth slack + a scalar value object
_ARRAY_COST = 96  # an array.array's header and allocation; plus its items

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


def printable(text: Any, limit: int = 64) -> str:
    """`text` cut to `limit` characters, safe in a one-line error message on any transport: stray
    bytes (surrogate escapes), other lone surrogates and control characters as escapes."""
    if not isinstance(text, str):
        text = repr(text)
    cut = text[:limit]
    if cut.isascii() and cut.isprintable():
        return cut + ("..." if len(text) > limit else "")
    out = "".join(c if c.isprintable() and not 0xD800 <= ord(c) <= 0xDFFF else ascii(c)[1:-1] for c in cut)
    return out + ("..." if len(text) > limit else "")


def _short_repr(value: Any) -> str:
    if isinstance(value, (list, array.array)):
        return f"an array of {len(value)}"
    return printable(repr(value), 40)


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
    """Bounds-checked reader over the file buffer, with the metadata's memory budget."""

    __slots__ = ("buf", "view", "pos", "end", "what", "budget")

    def __init__(self, buf, pos: int, end: int, view=None):
        self.buf, self.pos, self.end = buf, pos, end
        self.view = view if view is not None else memoryview(buf)  # zero-copy slices for arrays
        self.what = "header"
        self.budget = METADATA_BUDGET

    def charge(self, cost: int) -> None:
        if cost > self.budget:
            raise ModelFileError(f"GGUF metadata would take more than {METADATA_BUDGET >> 20} MiB of memory "
                                 f"({self.what}, at offset {self.pos}); no real model needs that much")
        self.budget -= cost

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

    def string(self, max_len: int = MAX_STRING_BYTES, cost: int = 0) -> str:
        """A length-prefixed string; its memory (cost + 4 per byte) is charged before it is made."""
        n = self.u64()
        if n > max_len:
            raise ModelFileError(f"GGUF {self.what} is {n} bytes long (at most {max_len} allowed) at offset {self.pos}")
        self.need(n)
        if cost:
            self.charge(cost + 4 * n)
        s = self.buf[self.pos : self.pos + n]
        self.pos += n
        # GGUF strings are UTF-8; keep stray bytes (some vocabularies carry them) losslessly.
        return s.decode("utf-8", "surrogateescape")

    def count(self, n: int, min_item: int, what: str, most: int) -> int:
        # A count is believable only if it is one a real model needs and that many items of at
        # least min_item bytes fit in the file.
        if n > most:
            raise ModelFileError(f"GGUF {what} count {n} exceeds the limit of {most} at offset {self.pos}")
        if n * min_item > self.end - self.pos:
            raise ModelFileError(f"GGUF {what} count {n} cannot fit in the {self.end - self.pos} bytes left at offset {self.pos}")
        return n


def _read_string_array(cur: _Cursor, n: int) -> list[str]:
    # The strings' memory is charged before they are made: _STR_COST each now, and 4 per byte
    # through `lim`, the end of the file region whose strings the remaining budget can hold.
    cur.charge(n * _STR_COST)
    buf, pos, end = cur.buf, cur.pos, cur.end
    start = pos
    lim = min(end, pos + 8 * n + cur.budget // 4)
    unpack = _U64.unpack_from
    out = [""] * n
    for i in range(n):
        if pos + 8 > end:
            cur.pos = pos
            cur.need(8)
        (length,) = unpack(buf, pos)
        pos += 8
        if length > lim - pos:
            cur.pos = pos
            cur.need(length)  # truncated file, else over budget:
            cur.charge(cur.budget + 1)
        out[i] = buf[pos : pos + length].decode("utf-8", "surrogateescape")
        pos += length
    cur.pos = pos
    cur.budget -= 4 * (pos - start - 8 * n)
    return out


def _read_value(cur: _Cursor, vtype: int) -> Any:
    scalar = _SCALARS.get(vtype)
    if scalar is not None:
        cur.need(scalar.size)
        (v,) = scalar.unpack_from(cur.buf, cur.pos)
        cur.pos += scalar.size
        return v
    if vtype == _STRING:
        return cur.string(MAX_STRING_BYTES, _STR_COST)
    if vtype == _ARRAY:
        etype = cur.u32()
        n = cur.u64()
        if etype in _SCALARS:
            size = _SCALARS[etype].size
            cur.count(n, size, "array", MAX_ARRAY)
            cur.charge(_ARRAY_COST + n * size)
            arr = array.array(_ARRAY_CODES[etype])
            arr.frombytes(cur.view[cur.pos : cur.pos + n * size])
            cur.pos += n * size
            return arr
        if etype == _STRING:
            return _read_string_array(cur, cur.count(n, 8, "string array", MAX_ARRAY))
        if etype == _ARRAY:  # llama.cpp's loader refuses them too, so no real file has them
            raise ModelFileError(f"GGUF nested arrays are not supported (at offset {cur.pos})")
        raise ModelFileError(f"GGUF unknown array element type {etype} at offset {cur.pos}")
    raise ModelFileError(f"GGUF unknown metadata value type {vtype} at offset {cur.pos}")


class GGUFFile:
    """A parsed GGUF file backed by a read-only mmap. Use as a context manager or call close()."""

    def __init__(self, path: str | os.PathLike, index: dict | None = None):
        """index: a cached parse of this same file (modelcache.py), which skips the parsing."""
        self.path = os.fspath(path)
        where = printable(self.path, 1024)
        self._fd = -1
        self._mmap = None
        try:
            # O_NONBLOCK: opening a FIFO (or a tty) must not wait for a writer; it is refused below.
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            raise ModelFileError(f"model file not found: {where}") from None
        except IsADirectoryError:
            raise ModelFileError(f"model path is a directory, not a GGUF file: {where}") from None
        except OSError as e:
            raise ModelFileError(f"cannot open model file {where}: {e.strerror}") from None
        except ValueError:  # an embedded NUL
            raise ModelFileError(f"model path is not a valid file name: {where}") from None
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise ModelFileError(f"model path is a directory, not a GGUF file: {where}")
            if not stat.S_ISREG(st.st_mode):
                raise ModelFileError(f"model path is not a regular file: {where}")
            self.size = st.st_size
            if self.size < _HEADER.size:
                raise ModelFileError(f"not a GGUF file (only {self.size} bytes): {where}")
            try:
                self._mmap = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as e:
                raise ModelFileError(f"cannot map model file {where}: {e}") from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd  # kept for read_tensor (pread); closed by close()
        try:
            if index is not None and self._restore(index):
                return
            self._parse()
        except ModelFileError as e:
            self.close()
            raise ModelFileError(f"{e} ({where})") from None
        except (struct.error, MemoryError, OverflowError) as e:  # belt and braces: still one line
            self.close()
            raise ModelFileError(f"malformed GGUF ({type(e).__name__}: {e}): {where}") from None

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
        with memoryview(buf) as view:
            cur = _Cursor(buf, _HEADER.size, self.size, view)
            self._parse_sections(cur, n_tensors, n_kv)

    def _parse_sections(self, cur: _Cursor, n_tensors: int, n_kv: int) -> None:
        # Each KV needs >= 8 (key len) + 4 (type) + 1 bytes; each tensor >= 8 + 4 + 8 + 4 + 8.
        cur.count(n_kv, 13, "metadata", MAX_KV)
        cur.count(n_tensors, 32, "tensor", MAX_TENSORS)

        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            cur.what = "metadata key"
            key = cur.string(MAX_KEY_BYTES, _KEY_COST)
            cur.what = f"metadata '{printable(key)}'"
            vtype = cur.u32()
            if key in metadata:
                raise ModelFileError(f"GGUF duplicate metadata key '{printable(key)}'")
            metadata[key] = _read_value(cur, vtype)
        self.metadata = metadata
        self.metadata_cost = METADATA_BUDGET - cur.budget  # the bytes charged (an upper bound)

        alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
        if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1) or alignment > 1 << 30:
            raise ModelFileError(f"GGUF general.alignment must be a power of two up to 2^30, got {_short_repr(alignment)}")
        self.alignment = alignment

        raw = []
        for _ in range(n_tensors):
            cur.what = "tensor name"
            name = cur.string(MAX_TENSOR_NAME_BYTES)
            cur.what = f"tensor '{printable(name)}'"
            n_dims = cur.u32()
            if not 1 <= n_dims <= MAX_DIMS:
                raise ModelFileError(f"tensor '{printable(name)}' has {n_dims} dimensions (1..{MAX_DIMS} allowed)")
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
                raise ModelFileError(f"tensor '{printable(name)}' has unknown ggml type id {ggml_type}")
            n_el = 1
            for d in shape:
                if d <= 0 or d > data_len * t.block_size:
                    raise ModelFileError(f"tensor '{printable(name)}' has impossible dimension {d}")
                n_el *= d
            if shape[0] % t.block_size:
                raise ModelFileError(
                    f"tensor '{printable(name)}' row of {shape[0]} is not a multiple of the {t.name} block size {t.block_size}"
                )
            nbytes = n_el // t.block_size * t.type_size
            if rel_offset % alignment:
                raise ModelFileError(f"tensor '{printable(name)}' offset {rel_offset} is not aligned to {alignment}")
            if rel_offset + nbytes > data_len:
                raise ModelFileError(
                    f"tensor '{printable(name)}' data ({nbytes} bytes at {rel_offset}) runs past the end of the file"
                )
            if name in tensors:
                raise ModelFileError(f"GGUF duplicate tensor name '{printable(name)}'")
            tensors[name] = TensorInfo(name, shape, ggml_type, data_start + rel_offset, nbytes)

        ordered = sorted(tensors.values(), key=lambda ti: ti.offset)
        for a, b in zip(ordered, ordered[1:]):
            if b.offset < a.offset + a.nbytes:
                raise ModelFileError(f"tensors '{printable(a.name)}' and '{printable(b.name)}' overlap in the file")
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
            raise ModelFileError(f"GGUF has no general.architecture string: {printable(self.path, 1024)}")
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
            raise ModelFileError(f"GGUF has no tensor '{printable(name)}': {printable(self.path, 1024)}") from None

    def tensor_data(self, name: str) -> memoryview:
        """Zero-copy view of one tensor's bytes in the mapped file (tools and tests; the runtime
        reads with read_tensor, see the module docstring)."""
        ti = self.tensor(name)
        if self._mmap is None:
            raise ModelFileError(f"the mapping of {printable(self.path, 1024)} was released; read tensors with read_tensor")
        return memoryview(self._mmap)[ti.offset : ti.offset + ti.nbytes]

    def read_tensor(self, name: str, start: int = 0, length: int | None = None, into=None):
        """A private copy of a tensor's bytes [start, start + length) (default: all of them), read
        with pread into `into` (a writable buffer of that length) or a new bytearray. A file
        truncated since it was opened gives ModelFileError, never a SIGBUS."""
        ti = self.tensor(name)
        if length is None:
            length = ti.nbytes - start
        if start < 0 or length < 0 or start + length > ti.nbytes:
            raise ValueError(f"bytes [{start}, {start + length}) are outside tensor '{printable(name)}' ({ti.nbytes} bytes)")
        out = bytearray(length) if into is None else into
        with memoryview(out) as raw, raw.cast("B") as view:
            if len(view) != length:
                raise ValueError(f"read_tensor: the buffer holds {len(view)} bytes, not {length}")
            done = 0
            while done < length:
                try:
                    got = os.preadv(self._fd, [view[done:]], ti.offset + start + done)
                except OSError as e:
                    raise ModelFileError(f"cannot read tensor '{printable(name)}' from {printable(self.path, 1024)}: "
                                         f"{e.strerror or e}") from None
                if got <= 0:
                    raise ModelFileError(
                        f"model file {printable(self.path, 1024)} is shorter than when it was opened (truncated while "
                        f"in use?): tensor '{printable(name)}' cannot be read; restart with an intact file")
                done += got
        return out

    @property
    def buffer(self) -> mmap.mmap:
        return self._mmap

    def release_mapping(self) -> None:
        """Unmap the file (the parsed header stays; read_tensor keeps working). The loader calls
        this once a model is loaded, so no later access can touch pages of a file that may have
        been truncated since: that would be a SIGBUS, which no handler can turn into an error."""
        mm, self._mmap = self._mmap, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                self._mmap = mm  # views are still alive (tools): keep it

    def close(self) -> None:
        self.release_mapping()
        self._mmap = None
        fd, self._fd = getattr(self, "_fd", -1), -1
        if fd >= 0:
            os.close(fd)

    def __copy__(self) -> "GGUFFile":
        """A shallow copy (tests edit a copy's metadata) with its own descriptor and mapping, so
        closing either one leaves the other working."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new._fd = os.dup(self._fd) if self._fd >= 0 else -1
        new._mmap = mmap.mmap(new._fd, 0, access=mmap.ACCESS_READ) if self._mmap is not None else None
        return new

    def __del__(self) -> None:  # the descriptor is ours: do not leak it with the object
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GGUFFile({self.path!r}, v{self.version}, {len(self.metadata)} keys, {len(self.tensors)} tensors)"
