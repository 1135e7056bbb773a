"""The model configuration every backend reads: one dataclass, filled from GGUF metadata."""

from __future__ import annotations

import array
import math
from dataclasses import dataclass, field
from typing import Any

from ..modelfile import tensor_names as T
from ..errors import ModelFileError, UnsupportedModelError
from ..modelfile.ggml_types import COMPUTE_TYPES, GGML_TYPES
from ..modelfile.gguf_file import printable


@dataclass
class ModelConfig:
    arch: str
    n_layers: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int  # key/query head size
    head_dim_v: int  # value head size
    vocab_size: int
    context_length: int
    rms_eps: float
    rope_theta: float
    rope_dim: int  # rotated dimensions per head (NeoX style: first half / second half)
    tied_embeddings: bool  # no output.weight: the LM head is token_embd
    # family-specific settings (gemma3: sliding window, local rope base, scales; MoE: experts...)
    extra: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    file_type: str = ""


# Bounds on what the families read (real models in brackets). Values outside them are refused
# as a malformed file before anything is sized from them.
MAX_INT = (1 << 31) - 1  # any integer key: counts and lengths fit in int32 [context: <= 10M]
MAX_LAYERS = 1024  # block_count [Llama 3.1 405B: 126]
MAX_WIDTH = 1 << 20  # embedding, FFN, head and rank sizes [FFN: <= 53,248]
MAX_HEADS = 1 << 12  # attention / recurrent heads [<= 128]
MAX_EXPERTS = 1 << 14  # routed experts [<= 512]


class MetadataReader:
    """Typed, bounded reads of `{arch}.*` (and `general.*`, `tokenizer.*`) keys: a value of the
    wrong type or out of its bounds is a one-line ModelFileError that names the key."""

    def __init__(self, gguf):
        self.gguf = gguf
        self.arch = gguf.architecture

    def full_key(self, key: str) -> str:
        return key if key.startswith(("general.", "tokenizer.")) else f"{self.arch}.{key}"

    def _get(self, key: str, default, required: bool):
        full = self.full_key(key)
        value = self.gguf.get(full)
        if value is None:
            if required:
                raise ModelFileError(f"GGUF is missing required key '{printable(full)}': {printable(self.gguf.path, 1024)}")
            return default
        return value

    def bad(self, key: str, want: str, value) -> ModelFileError:
        return ModelFileError(f"GGUF key '{printable(self.full_key(key))}' should be {want}, got {describe(value)}: "
                              f"{printable(self.gguf.path, 1024)}")

    def int(self, key: str, default: int | None = None, required: bool = False, *, lo: int = 0,
            hi: int = MAX_INT) -> int | None:
        """An integer in [lo, hi] (by default any non-negative int32): every integer the families
        read is a count, a length, an index or an enum."""
        v = self._get(key, default, required and default is None)
        if v is None:
            return None
        if type(v) is not int:
            raise self.bad(key, "an integer", v)
        if not lo <= v <= hi:
            raise self.bad(key, f"an integer in {lo}..{hi}", v)
        return v

    def float(self, key: str, default: float | None = None, required: bool = False, *, lo: float = -math.inf,
              hi: float = math.inf, lo_open: bool = False) -> float | None:
        """A finite number in [lo, hi] ((lo, hi] with lo_open)."""
        v = self._get(key, default, required and default is None)
        if v is None:
            return None
        if type(v) not in (int, float):
            raise self.bad(key, "a number", v)
        v = float(v)
        if not (math.isfinite(v) and (lo < v if lo_open else lo <= v) and v <= hi):
            raise self.bad(key, f"a finite number in {'(' if lo_open else '['}{lo:g}, {hi:g}]", v)
        return v

    def str(self, key: str, default: str | None = None) -> str | None:
        v = self._get(key, default, False)
        if v is not None and not isinstance(v, str):
            raise self.bad(key, "a string", v)
        return v

    def flag(self, key: str, default: bool = False) -> bool:
        v = self._get(key, default, False)
        if type(v) is not bool:
            raise self.bad(key, "a boolean", v)
        return v

    def ints(self, key: str, n: int, *, lo: int = 0, hi: int = MAX_INT) -> tuple[int, ...] | None:
        """An array of at least n integers in [lo, hi] (its first n), or None when absent."""
        v = self._get(key, None, False)
        if v is None:
            return None
        if not isinstance(v, (list, array.array)) or len(v) < n or not all(type(x) is int for x in v[:n]):
            raise self.bad(key, f"an array of {n} integers", v)
        out = tuple(v[:n])
        if not all(lo <= x <= hi for x in out):
            raise self.bad(key, f"integers in {lo}..{hi}", v)
        return out

    def layers(self, key: str = "block_count") -> int:
        """The layer count: at least 1, at most MAX_LAYERS, and no more than the file has tensors
        (each layer has several), so nothing is ever sized from an absurd count."""
        n = self.int(key, required=True, lo=1, hi=MAX_LAYERS)
        if n > len(self.gguf.tensors):
            raise self.bad(key, f"at most the file's {len(self.gguf.tensors)} tensors", n)
        return n


def describe(value) -> str:
    """A value as an error message shows it: short, one line, printable."""
    if isinstance(value, (list, array.array)):
        return f"an array of {len(value)}"
    if isinstance(value, str):
        return f"the string '{printable(value, 40)}'"
    return printable(repr(value), 40)


def embedding_shape(gguf) -> tuple[int, int]:
    """(n_embd, vocab) of token_embd.weight, which must be a matrix."""
    ti = gguf.tensor(T.TOKEN_EMBD)
    if len(ti.shape) != 2:
        raise ModelFileError(f"GGUF tensor '{T.TOKEN_EMBD}' should be a matrix (n_embd, vocab), has shape {ti.shape}: "
                             f"{printable(gguf.path, 1024)}")
    return ti.shape[0], ti.shape[1]


def check_shapes(gguf, want: dict[str, tuple[int, ...]], arch: str, loose: frozenset[str] = frozenset()) -> None:
    """Every tensor in `want` exists with exactly that shape (ggml order); for the names in
    `loose`, trailing 1s of the file's shape are ignored (converters write some vectors as
    (n, 1), and the forward reading them flattens them)."""
    for name, shape in want.items():
        ti = gguf.tensors.get(name)
        if ti is None:
            raise ModelFileError(f"GGUF is missing tensor '{name}' ({printable(arch)}): {printable(gguf.path, 1024)}")
        got = tuple(ti.shape)
        while name in loose and len(got) > len(shape) and got[-1] == 1:
            got = got[:-1]
        if got != shape:
            raise ModelFileError(f"GGUF tensor '{name}' has shape {tuple(ti.shape)}, expected {shape}: "
                                 f"{printable(gguf.path, 1024)}")


def attention_shapes(config: "ModelConfig", il: int, gguf) -> dict[str, tuple[int, ...]]:
    """The dense attention's tensors of layer il (q/k/v/output, and q/k norms when the file has
    them), in ggml order, as the reference and GPU blocks read them."""
    c, d = config, config.n_embd
    shapes = {
        T.blk(il, T.ATTN_NORM): (d,),
        T.blk(il, T.ATTN_Q): (d, c.n_head * c.head_dim),
        T.blk(il, T.ATTN_K): (d, c.n_head_kv * c.head_dim),
        T.blk(il, T.ATTN_V): (d, c.n_head_kv * c.head_dim_v),
        T.blk(il, T.ATTN_OUT): (c.n_head * c.head_dim_v, d),
    }
    if T.blk(il, T.ATTN_Q_NORM) in gguf.tensors or T.blk(il, T.ATTN_K_NORM) in gguf.tensors:
        shapes[T.blk(il, T.ATTN_Q_NORM)] = (c.head_dim,)
        shapes[T.blk(il, T.ATTN_K_NORM)] = (c.head_dim,)
    return shapes


def gated_ffn_shapes(n_embd: int, n_ff: int, il: int) -> dict[str, tuple[int, ...]]:
    return {T.blk(il, T.FFN_NORM): (n_embd,), T.blk(il, T.FFN_GATE): (n_embd, n_ff),
            T.blk(il, T.FFN_UP): (n_embd, n_ff), T.blk(il, T.FFN_DOWN): (n_ff, n_embd)}


def head_shapes(config: "ModelConfig") -> dict[str, tuple[int, ...]]:
    """Embedding, final norm and (untied) LM head."""
    shapes = {T.TOKEN_EMBD: (config.n_embd, config.vocab_size), T.OUTPUT_NORM: (config.n_embd,)}
    if not config.tied_embeddings:
        shapes[T.OUTPUT] = (config.n_embd, config.vocab_size)
    return shapes


def validate(config: "ModelConfig", gguf) -> "ModelConfig":
    """The invariants every backend relies on, checked once for every family (read_config)."""
    c = config
    where = printable(gguf.path, 1024)
    checks = (
        (1 <= c.n_layers <= MAX_LAYERS, f"{c.n_layers} layers (1..{MAX_LAYERS} supported)"),
        (1 <= c.n_embd <= MAX_WIDTH and 0 <= c.n_ff <= MAX_WIDTH, f"n_embd {c.n_embd}, n_ff {c.n_ff}"),
        (1 <= c.n_head_kv <= c.n_head <= MAX_HEADS and c.n_head % c.n_head_kv == 0,
         f"{c.n_head} heads and {c.n_head_kv} KV heads (need 1 <= KV heads <= heads, heads a multiple of KV heads)"),
        (1 <= c.head_dim <= MAX_WIDTH and 1 <= c.head_dim_v <= MAX_WIDTH, f"head sizes {c.head_dim}/{c.head_dim_v}"),
        (0 <= c.rope_dim <= c.head_dim and c.rope_dim % 2 == 0,
         f"rope dimension {c.rope_dim} (need an even number up to the head size {c.head_dim})"),
        (1 <= c.vocab_size, f"vocabulary of {c.vocab_size}"),
        (1 <= c.context_length <= MAX_INT, f"context length {c.context_length}"),
        (math.isfinite(c.rms_eps) and 0 < c.rms_eps <= 1, f"RMS norm epsilon {c.rms_eps!r}"),
        (math.isfinite(c.rope_theta) and c.rope_theta > 1, f"rope base {c.rope_theta!r} (need > 1)"),
    )
    for ok, what in checks:
        if not ok:
            raise ModelFileError(f"GGUF {printable(c.arch)} model has an impossible {what}: {where}")
    return config


def check_tensor_types(gguf, allowed=COMPUTE_TYPES) -> None:
    """Fail early, naming the tensor, if a weight uses a quantization no backend can read."""
    for ti in gguf.tensors.values():
        name = GGML_TYPES[ti.ggml_type].name
        if name not in allowed:
            raise UnsupportedModelError(
                f"unsupported quantization type {name} (tensor '{printable(ti.name)}'); supported: {', '.join(sorted(allowed))}"
            )


def file_type_name(gguf) -> str:
    """Human name of general.file_type (the LLAMA_FTYPE enum, e.g. 15 = MOSTLY_Q4_K_M)."""
    ft = MetadataReader(gguf).int("general.file_type")
    return _FTYPES.get(ft, f"file_type {ft}") if ft is not None else ""


# llama_ftype values (gguf.LlamaFileType) -> the names users know.
_FTYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 32: "BF16",
}
