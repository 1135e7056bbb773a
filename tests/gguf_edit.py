"""A GGUF file as an editable structure, for tests that build malformed files.

    model = GGUFModel.load(path)          # header, (key, type, value) entries, tensor infos, data
    model.set("qwen3.block_count", 2**32 - 1, VT.UINT32)
    model.tensor("token_embd.weight").dims = [64]
    blob, fields = model.to_bytes()       # the file, and where each count/length/type field lies

Independent of reflex_runtime.modelfile.gguf_file on purpose (a test of a parser should not be built with
it): entries keep their GGUF value type, unmodified entries keep their original bytes, and the
tensor data is laid out again (aligned, in order) on every write, so shapes may change.
`fields` lets a fuzzer patch raw counts and lengths after the structure has been written.
"""

from __future__ import annotations

import array
import struct
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any


class VT(IntEnum):
    """GGUF metadata value types."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


_SCALAR = {VT.UINT8: "<B", VT.INT8: "<b", VT.UINT16: "<H", VT.INT16: "<h", VT.UINT32: "<I", VT.INT32: "<i",
           VT.FLOAT32: "<f", VT.BOOL: "<?", VT.UINT64: "<Q", VT.INT64: "<q", VT.FLOAT64: "<d"}
_CODES = {VT.UINT8: "B", VT.INT8: "b", VT.UINT16: "H", VT.INT16: "h", VT.UINT32: "I", VT.INT32: "i",
          VT.FLOAT32: "f", VT.BOOL: "B", VT.UINT64: "Q", VT.INT64: "q", VT.FLOAT64: "d"}
MAGIC = 0x46554747
# ggml type id -> (block size, bytes per block), for the types our fixtures use and a few more
GGML_SIZES = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
              10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 30: (1, 2)}


def _str(b: bytes | str) -> bytes:
    return b.encode("utf-8", "surrogateescape") if isinstance(b, str) else b


def encode_value(vtype: int, value: Any, etype: int | None = None) -> bytes:
    """The payload of a value (after its type id)."""
    if vtype in _SCALAR:
        return struct.pack(_SCALAR[VT(vtype)], value)
    if vtype == VT.STRING:
        b = _str(value)
        return struct.pack("<Q", len(b)) + b
    if vtype == VT.ARRAY:
        head = struct.pack("<IQ", etype, len(value))
        if etype in _CODES:
            a = value if isinstance(value, array.array) and value.typecode == _CODES[VT(etype)] else \
                array.array(_CODES[VT(etype)], value)
            return head + a.tobytes()
        if etype == VT.STRING:
            return head + b"".join(struct.pack("<Q", len(_str(s))) + _str(s) for s in value)
        if etype == VT.ARRAY:  # value: list of (etype, list)
            return head + b"".join(encode_value(VT.ARRAY, v, e) for e, v in value)
        raise ValueError(f"cannot encode array of type {etype}")
    raise ValueError(f"cannot encode value type {vtype}")


@dataclass
class KV:
    key: bytes
    vtype: int
    etype: int | None  # element type of arrays
    value: Any  # python value (arrays: list / array.array)
    raw: bytes | None = None  # the encoded payload, when unchanged since load

    def payload(self) -> bytes:
        if self.raw is None:
            self.raw = encode_value(self.vtype, self.value, self.etype)
        return self.raw


@dataclass
class Tensor:
    name: bytes
    dims: list[int]
    ggml_type: int
    data: Any  # bytes-like
    offset: int | None = None  # None: laid out in order; else this relative offset is written

    @property
    def row_bytes(self) -> int:
        block, size = GGML_SIZES[self.ggml_type]
        return self.dims[0] // block * size


@dataclass
class Fields:
    """Offsets, in the written file, of the fields a fuzzer patches."""

    n_tensors: int = 8
    n_kv: int = 16
    kv: list[dict] = field(default_factory=list)  # key_len, vtype, [etype, count | str_len], value, end
    tensor: list[dict] = field(default_factory=list)  # name_len, n_dims, dims[], type, offset
    data_offset: int = 0


class GGUFModel:
    def __init__(self, version: int, kvs: list[KV], tensors: list[Tensor], alignment: int = 32):
        self.version, self.kvs, self.tensors, self.alignment = version, kvs, tensors, alignment

    # -- reading ----------------------------------------------------------------------------

    @classmethod
    def load(cls, path) -> "GGUFModel":
        with open(path, "rb") as f:
            blob = f.read()
        return cls.parse(blob)

    @classmethod
    def parse(cls, blob: bytes) -> "GGUFModel":
        mv = memoryview(blob)
        magic, version, n_tensors, n_kv = struct.unpack_from("<IIQQ", blob, 0)
        assert magic == MAGIC
        pos = 24

        def u32():
            nonlocal pos
            (v,) = struct.unpack_from("<I", blob, pos)
            pos += 4
            return v

        def u64():
            nonlocal pos
            (v,) = struct.unpack_from("<Q", blob, pos)
            pos += 8
            return v

        def string() -> bytes:
            nonlocal pos
            n = u64()
            s = bytes(mv[pos:pos + n])
            pos += n
            return s

        def value(vtype):
            nonlocal pos
            if vtype in _SCALAR:
                (v,) = struct.unpack_from(_SCALAR[VT(vtype)], blob, pos)
                pos += struct.calcsize(_SCALAR[VT(vtype)])
                return v, None
            if vtype == VT.STRING:
                return string().decode("utf-8", "surrogateescape"), None
            etype, n = u32(), u64()
            if etype in _CODES:
                a = array.array(_CODES[VT(etype)])
                a.frombytes(mv[pos:pos + n * a.itemsize])
                pos += n * a.itemsize
                return a, etype
            if etype == VT.STRING:
                return [string().decode("utf-8", "surrogateescape") for _ in range(n)], etype
            raise ValueError(f"unsupported array type {etype}")

        kvs = []
        for _ in range(n_kv):
            key = string()
            vtype = u32()
            start = pos
            v, etype = value(vtype)
            kvs.append(KV(key, vtype, etype, v, bytes(mv[start:pos])))
        alignment = next((kv.value for kv in kvs if kv.key == b"general.alignment"), 32)
        infos = []
        for _ in range(n_tensors):
            name = string()
            dims = [u64() for _ in range(u32())]
            infos.append((name, dims, u32(), u64()))
        data_start = -(-pos // alignment) * alignment
        tensors = []
        for name, dims, gtype, off in infos:
            t = Tensor(name, dims, gtype, b"")
            n_el = 1
            for d in dims:
                n_el *= d
            block, size = GGML_SIZES[gtype]
            t.data = mv[data_start + off:data_start + off + n_el // block * size]
            tensors.append(t)
        return cls(version, kvs, tensors, alignment)

    # -- editing ----------------------------------------------------------------------------

    def index(self, key: str) -> int:
        k = _str(key)
        for i, kv in enumerate(self.kvs):
            if kv.key == k:
                return i
        return -1

    def get(self, key: str, default=None):
        i = self.index(key)
        return self.kvs[i].value if i >= 0 else default

    def kv(self, key: str) -> KV | None:
        i = self.index(key)
        return self.kvs[i] if i >= 0 else None

    def set(self, key: str, value, vtype: int, etype: int | None = None) -> None:
        """Set (or add) key to value with this GGUF type."""
        kv = KV(_str(key), int(vtype), etype, value)
        i = self.index(key)
        if i >= 0:
            self.kvs[i] = kv
        else:
            self.kvs.append(kv)

    def remove(self, key: str) -> None:
        i = self.index(key)
        if i >= 0:
            del self.kvs[i]

    def tensor(self, name: str) -> Tensor:
        n = _str(name)
        return next(t for t in self.tensors if t.name == n)

    def copy(self) -> "GGUFModel":
        """A copy whose lists and entries can be changed without touching this one (values and
        data are shared: replace them, do not mutate them in place)."""
        return GGUFModel(self.version, [KV(k.key, k.vtype, k.etype, k.value, k.raw) for k in self.kvs],
                         [Tensor(t.name, list(t.dims), t.ggml_type, t.data, t.offset) for t in self.tensors],
                         self.alignment)

    # -- writing ----------------------------------------------------------------------------

    def to_bytes(self, n_kv: int | None = None, n_tensors: int | None = None) -> tuple[bytearray, Fields]:
        out = bytearray(struct.pack("<IIQQ", MAGIC, self.version,
                                    len(self.tensors) if n_tensors is None else n_tensors,
                                    len(self.kvs) if n_kv is None else n_kv))
        fields = Fields()
        for kv in self.kvs:
            f = {"key_len": len(out)}
            out += struct.pack("<Q", len(kv.key)) + kv.key
            f["vtype"] = len(out)
            out += struct.pack("<I", kv.vtype)
            f["value"] = len(out)
            if kv.vtype == VT.ARRAY:
                f["etype"], f["count"] = len(out), len(out) + 4
            elif kv.vtype == VT.STRING:
                f["str_len"] = len(out)
            out += kv.payload()
            f["end"] = len(out)
            fields.kv.append(f)
        align = self.alignment
        offsets, pos = [], 0
        for t in self.tensors:
            pos = -(-pos // align) * align
            offsets.append(pos)
            pos += len(t.data)
        for t, off in zip(self.tensors, offsets):
            f = {"name_len": len(out)}
            out += struct.pack("<Q", len(t.name)) + t.name
            f["n_dims"] = len(out)
            out += struct.pack("<I", len(t.dims))
            f["dims"] = [len(out) + 8 * i for i in range(len(t.dims))]
            out += struct.pack(f"<{len(t.dims)}Q", *t.dims)
            f["type"] = len(out)
            out += struct.pack("<I", t.ggml_type)
            f["offset"] = len(out)
            out += struct.pack("<Q", off if t.offset is None else t.offset)
            fields.tensor.append(f)
        data_start = -(-len(out) // align) * align
        out += bytes(data_start - len(out))
        fields.data_offset = data_start
        for t, off in zip(self.tensors, offsets):
            out += bytes(data_start + off - len(out))
            out += t.data
        return out, fields


def shrink_vocab(model: GGUFModel, n_keep: int) -> GGUFModel:
    """A copy with the vocabulary cut to its first n_keep tokens plus its control and user-defined
    tokens (renumbered after them), merges and per-token arrays cut to match, token ids in
    tokenizer.ggml.*_token_id keys renumbered (dropped if their token is gone), and the rows of
    token_embd / output gathered to the new vocabulary. Keeps a real converted file's structure
    while making it cheap to parse many times."""
    m = model.copy()
    tokens = m.get("tokenizer.ggml.tokens")
    types = m.get("tokenizer.ggml.token_type")
    special = [i for i in range(n_keep, len(tokens)) if types is not None and types[i] in (3, 4)]
    keep = list(range(min(n_keep, len(tokens)))) + special
    new_id = {old: new for new, old in enumerate(keep)}
    kept = [tokens[i] for i in keep]
    m.set("tokenizer.ggml.tokens", kept, VT.ARRAY, VT.STRING)
    for key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
        kv = m.kv(key)
        if kv is not None:
            m.set(key, array.array(kv.value.typecode, [kv.value[i] for i in keep]), VT.ARRAY, kv.etype)
    merges = m.get("tokenizer.ggml.merges")
    if merges is not None:
        present = set(kept)
        out = []
        for merge in merges:
            left, _, right = merge.partition(" ")
            if left in present and right in present and left + right in present:
                out.append(merge)
        m.set("tokenizer.ggml.merges", out, VT.ARRAY, VT.STRING)
    arch = m.get("general.architecture")
    if m.kv(f"{arch}.vocab_size") is not None:
        m.set(f"{arch}.vocab_size", len(keep), m.kv(f"{arch}.vocab_size").vtype)
    for kv in list(m.kvs):
        if kv.key.startswith(b"tokenizer.ggml.") and kv.key.endswith(b"_token_id"):
            if kv.value in new_id:
                m.set(kv.key.decode(), new_id[kv.value], kv.vtype)
            else:
                m.remove(kv.key.decode())
    for t in m.tensors:
        if t.name in (b"token_embd.weight", b"output.weight") and len(t.dims) == 2 and t.dims[1] == len(tokens):
            rb = t.row_bytes
            t.data = b"".join(t.data[i * rb:(i + 1) * rb] for i in keep)
            t.dims = [t.dims[0], len(keep)]
    return m
