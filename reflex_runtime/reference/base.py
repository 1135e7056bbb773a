"""What every reference model shares: dequantized weights, the KV cache, and the forward
contract (docs/INTERNALS.md "Reference forward")."""

from __future__ import annotations

import numpy as np

from ..modelfile import tensor_names as T
from ..errors import RequestError
from . import layers
from .blocks import lm_head

_F32 = np.float32


class Weights:
    """Tensors of a GGUF file as float32 numpy arrays in numpy order (ggml shape reversed, so a
    matrix is (out, in)), dequantized with gguf-py's `gguf.quants.dequantize` on first use and
    kept (set keep=False to dequantize on every use and hold nothing). Bytes come from
    GGUFFile.read_tensor (pread copies), never from the file mapping."""

    def __init__(self, gguf, keep: bool = True):
        import gguf as gguf_py  # ~0.35 s of imports: only the reference pays it

        self._gguf_py = gguf_py
        self.file = gguf
        self.keep = keep
        self._cache: dict[str, np.ndarray] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.file.tensors

    def _layout(self, name: str) -> tuple[object, int, tuple[int, ...]]:
        ti = self.file.tensor(name)
        qtype = self._gguf_py.GGMLQuantizationType(ti.ggml_type)
        block, type_size = self._gguf_py.GGML_QUANT_SIZES[qtype]
        return qtype, ti.shape[0] // block * type_size, tuple(reversed(ti.shape))

    def _raw(self, name: str, rows: slice | None = None) -> tuple[np.ndarray, object, tuple[int, ...]]:
        """The tensor's bytes as (rows, row_bytes) uint8, a private copy read with pread (never a
        view of the file mapping: a file truncated while the process runs must give an error,
        not a SIGBUS). `rows`: only that contiguous range of rows."""
        qtype, row_bytes, shape = self._layout(name)
        start, stop = (0, None) if rows is None else (rows.start, rows.stop)
        n_rows = self.file.tensor(name).nbytes // row_bytes if stop is None else stop - start
        raw = np.empty((n_rows, row_bytes), dtype=np.uint8)
        self.file.read_tensor(name, start * row_bytes, n_rows * row_bytes, into=raw)
        return raw, qtype, shape

    def dequantize(self, name: str) -> np.ndarray:
        raw, qtype, shape = self._raw(name)
        arr = self._gguf_py.quants.dequantize(raw, qtype)
        return np.asarray(arr, dtype=_F32).reshape(shape)

    def get(self, name: str) -> np.ndarray:
        arr = self._cache.get(name)
        if arr is None:
            arr = self.dequantize(name)
            if self.keep:
                self._cache[name] = arr
        return arr

    def rows(self, name: str, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` of a 2-D tensor, dequantizing only those rows unless it is already held."""
        arr = self._cache.get(name)
        if arr is not None:
            return arr[ids]
        qtype, row_bytes, shape = self._layout(name)
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        raw = np.empty((len(ids), row_bytes), dtype=np.uint8)
        for i, row in enumerate(ids.tolist()):
            self.file.read_tensor(name, row * row_bytes, row_bytes, into=raw[i])
        out = self._gguf_py.quants.dequantize(raw, qtype)
        return np.asarray(out, dtype=_F32).reshape(len(ids), shape[-1])

    def expert(self, name: str, xid: int) -> np.ndarray:
        """Expert xid's (out, in) matrix of a stacked expert tensor. Without kept weights only
        that expert's rows are dequantized (a real MoE file holds far more experts than a
        forward uses)."""
        if self.keep:
            return self.get(name)[xid]
        n_out = self._layout(name)[2][1]  # rows: (n_expert * out, row_bytes)
        block, qtype, shape = self._raw(name, slice(xid * n_out, (xid + 1) * n_out))
        arr = self._gguf_py.quants.dequantize(block, qtype)
        return np.asarray(arr, dtype=_F32).reshape(shape[1:])

    def nbytes_held(self) -> int:
        """Bytes of the arrays kept."""
        return sum(a.nbytes for a in self._cache.values())


class KVCache:
    """Per layer, keys (after RoPE) and values of every token so far, plus each slot's position.

    `length` tokens are valid; `copy()` is independent of the original; `truncate(n)` forgets
    everything after the first n tokens."""

    def __init__(self, shapes: list[tuple[int, int, int]], max_tokens: int):
        if max_tokens <= 0:
            raise RequestError(f"KV cache size must be positive, got {max_tokens}")
        self.capacity = int(max_tokens)
        self.k = [np.zeros((self.capacity, n_kv, dk), dtype=_F32) for n_kv, dk, _ in shapes]
        self.v = [np.zeros((self.capacity, n_kv, dv), dtype=_F32) for n_kv, _, dv in shapes]
        self.positions = np.zeros(self.capacity, dtype=np.int64)
        self.length = 0

    def copy(self) -> "KVCache":
        new = type(self).__new__(type(self))  # subclasses (recurrent caches) add their state
        new.capacity = self.capacity
        n = self.length

        def dup(a):  # zeros are mapped lazily: only the used rows cost memory and time
            b = np.zeros(a.shape, dtype=a.dtype)
            b[:n] = a[:n]
            return b

        new.k = [dup(a) for a in self.k]
        new.v = [dup(a) for a in self.v]
        new.positions = dup(self.positions)
        new.length = self.length
        return new

    def truncate(self, n: int) -> None:
        if not 0 <= n <= self.length:
            raise RequestError(f"cannot truncate a cache of {self.length} tokens to {n}")
        self.length = int(n)


class ReferenceModel:
    """A decoder-only transformer in numpy float32. Families define `layer` (and `embed` or
    `head` where theirs differ), built from reference/blocks.py."""

    supports_tree_mask = True

    def __init__(self, gguf, config, keep_weights: bool = True):
        self.gguf = gguf
        self.config = config
        self.w = Weights(gguf, keep=keep_weights)
        # Per row of the last forward: the smallest relative margin of any routing decision its
        # MoE layers made (None: the family reports none). `reflex check` reads it: a row whose
        # routing was a near-tie may legitimately differ on the GPU (check.py).
        self.route_margin: np.ndarray | None = None

    # -- the contract ---------------------------------------------------------------------

    def kv_shapes(self) -> list[tuple[int, int, int]]:
        c = self.config
        return [(c.n_head_kv, c.head_dim, c.head_dim_v)] * c.n_layers

    def new_cache(self, max_tokens: int) -> KVCache:
        return KVCache(self.kv_shapes(), max_tokens)

    def forward(self, token_ids, cache: KVCache, positions=None, mask=None) -> np.ndarray:
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        n = ids.size
        if n == 0:
            raise RequestError("forward needs at least one token")
        if ids.min() < 0 or ids.max() >= self.config.vocab_size:
            raise RequestError(f"token id out of range [0, {self.config.vocab_size})")
        start = cache.length
        if start + n > cache.capacity:
            raise RequestError(f"KV cache full: {start} + {n} tokens > {cache.capacity}")
        if positions is None:
            positions = start + np.arange(n, dtype=np.int64)
        else:
            positions = np.asarray(positions, dtype=np.int64).reshape(-1)
            if positions.size != n:
                raise RequestError(f"{positions.size} positions for {n} tokens")
        if mask is None:
            mask = np.tril(np.ones((n, n), dtype=bool))
        else:
            mask = np.asarray(mask, dtype=bool)
            if mask.shape != (n, n):
                raise RequestError(f"mask shape {mask.shape} should be ({n}, {n})")
        allowed = np.concatenate([np.ones((n, start), dtype=bool), mask], axis=1)
        key_pos = np.concatenate([cache.positions[:start], positions])
        step = _Step(cache, start, n, positions, key_pos, allowed)
        self.route_margin = None
        x = self.embed(ids)
        for il in range(self.config.n_layers):
            x = self.layer(il, x, step)
        logits = self.head(x)
        cache.positions[start:start + n] = positions
        cache.length = start + n
        return logits

    # -- helpers for subclasses -------------------------------------------------------------

    def note_route_margin(self, margin: np.ndarray) -> None:
        """A MoE layer's per-row routing margins (n,) for route_margin (the minimum over layers)."""
        m = np.asarray(margin, dtype=np.float64)
        self.route_margin = m if self.route_margin is None else np.minimum(self.route_margin, m)

    def attend(self, il: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, step: "_Step",
               scale: float, window: int = 0) -> np.ndarray:
        """Store this layer's new k/v in the cache and attend over cache + new tokens.
        window > 0: a key at position p0 is hidden from a query at p1 when p1 - p0 >= window."""
        cache, s, n = step.cache, step.start, step.n
        cache.k[il][s:s + n] = k
        cache.v[il][s:s + n] = v
        allowed = step.allowed
        if window > 0:
            allowed = allowed & ((step.positions[:, None] - step.key_pos[None, :]) < window)
        return layers.attention(q, cache.k[il][:s + n], cache.v[il][:s + n], allowed, scale)

    def embed(self, ids: np.ndarray) -> np.ndarray:
        return self.w.rows(T.TOKEN_EMBD, ids)

    def layer(self, il: int, x: np.ndarray, step: "_Step") -> np.ndarray:
        raise NotImplementedError

    def head(self, x: np.ndarray) -> np.ndarray:
        return lm_head(self, x)


class _Step:
    """One forward call's bookkeeping, shared by its layers."""

    __slots__ = ("cache", "start", "n", "positions", "key_pos", "allowed", "memo")

    def __init__(self, cache, start, n, positions, key_pos, allowed):
        self.cache, self.start, self.n = cache, start, n
        self.positions, self.key_pos, self.allowed = positions, key_pos, allowed
        self.memo: dict = {}  # per-call values layers share (RoPE tables)

    def rope(self, rope_dim: int, theta: float, freq_scale: float = 1.0, factors=None):
        key = (rope_dim, theta, freq_scale, None if factors is None else id(factors))
        cs = self.memo.get(key)
        if cs is None:
            cs = self.memo[key] = layers.rope_cos_sin(self.positions, rope_dim, theta, freq_scale, factors)
        return cs
