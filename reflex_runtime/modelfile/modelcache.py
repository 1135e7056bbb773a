"""A per-model index cache: the parsed GGUF header and the tokenizer's sorted orders, marshalled.

Parsing a GGUF with a 151k-token vocabulary creates ~300k Python objects; `marshal.loads` of the
same structures is quicker. The index is keyed by the file's absolute path, size and mtime in
whole seconds (a changed file is simply re-parsed), written after the first request has been answered (never on
the critical path), and can be baked into a container image next to the model (`reflex pull` /
the Dockerfile do this).

The file is a magic line, a small marshalled header, then slices: every list or dict longer than
PIECE items is stored as several marshalled slices. `marshal.loads` holds the GIL for its whole
call, and the cold path's other threads need the GIL back after every driver call and read: CUDA's
context came up ~0.1 s late behind a single loads of a 248k-token vocabulary (0.2-0.35 s;
results/2026-12-02-h200-s12).
Slices keep each hold near a millisecond. The tokenizer's dictionaries are not kept (format 1
kept them: loading a dict hashes every key, as building it does); the sorted orders of its token
texts and merges are (array bytes: one copy to load), so the first requests look tokens up by
bisection and no dict is built on the cold path (text/lookup.py).
"""

from __future__ import annotations

import array
import hashlib
import marshal
import os
from pathlib import Path

FORMAT = 2
MAGIC = b"reflex-index 2\n"
PIECE = 4096  # items per marshalled slice: ~1-2 ms of loads, the longest the GIL is held here
_HEAD = 8  # the header's length, little-endian, after MAGIC


def index_dir() -> Path:
    from .embedded import model_cache_dir

    return Path(os.environ.get("REFLEX_INDEX_DIR") or model_cache_dir() / "index")


def _key(path: str) -> tuple[str, dict]:
    real = os.path.realpath(path)
    st = os.stat(real)
    # Whole seconds: container image layers may keep no finer file times, and an index baked
    # beside the model (the Dockerfile) must still match after a push and a pull.
    ident = {"format": FORMAT, "path": real, "size": st.st_size, "mtime_s": int(st.st_mtime)}
    # The format is in the name too: trees of two formats sharing a cache folder (an A/B run, a
    # rollback) each keep their own index instead of overwriting each other's on every start.
    return f"{hashlib.sha1(real.encode()).hexdigest()[:20]}-{FORMAT}", ident


def load(path: str) -> dict | None:
    """The cached index for this exact file, or None (missing, stale or unreadable)."""
    if os.environ.get("REFLEX_NO_INDEX") == "1":
        return None
    try:
        name, ident = _key(path)
        with open(index_dir() / f"{name}.marshal", "rb") as f:
            data = memoryview(f.read())  # marshal.load(f) reads in small pieces: 4x slower
        if data[:len(MAGIC)] != MAGIC:
            return None
        at = len(MAGIC) + _HEAD
        size = int.from_bytes(data[len(MAGIC):at], "little")
        head = marshal.loads(data[at:at + size])
        if not isinstance(head, dict) or head.get("ident") != ident:
            return None
        return _join(head["skeleton"], _Slices(data, at + size, head["slices"]))
    except (OSError, EOFError, ValueError, TypeError, KeyError, IndexError):
        return None


class _Slices:
    """The file's slices, loaded one at a time in the order save() wrote them."""

    def __init__(self, data: memoryview, at: int, sizes: list):
        self.data, self.at, self.sizes, self.next = data, at, sizes, 0

    def take(self):
        size = self.sizes[self.next]
        self.next += 1
        self.at += size
        return marshal.loads(self.data[self.at - size:self.at])


def _split(obj, slices: list):
    """obj with every long list or dict (and those in its dicts) replaced by a placeholder
    ("__slices__", kind, count); the marshalled slices appended to `slices`."""
    if isinstance(obj, dict) and len(obj) <= PIECE:
        return {k: _split(v, slices) for k, v in obj.items()}
    if isinstance(obj, (list, dict)) and len(obj) > PIECE:
        items = list(obj.items()) if isinstance(obj, dict) else obj
        parts = [items[i:i + PIECE] for i in range(0, len(items), PIECE)]
        slices.extend(marshal.dumps(dict(p) if isinstance(obj, dict) else p, 4) for p in parts)
        return ("__slices__", "dict" if isinstance(obj, dict) else "list", len(parts))
    return obj


def _join(obj, slices: _Slices):
    if isinstance(obj, dict):
        return {k: _join(v, slices) for k, v in obj.items()}
    if isinstance(obj, tuple) and len(obj) == 3 and obj[0] == "__slices__":
        out = {} if obj[1] == "dict" else []
        add = out.update if obj[1] == "dict" else out.extend
        for _ in range(obj[2]):
            add(slices.take())
        return out
    return obj


def save(path: str, gguf, tokenizer) -> bool:
    """Write the index for this file (atomically). False when it cannot be written."""
    if os.environ.get("REFLEX_NO_INDEX") == "1":
        return False
    try:
        name, ident = _key(path)
        slices: list[bytes] = []
        skeleton = _split({"gguf": export_gguf(gguf), "tokenizer": tokenizer.export_tables()}, slices)
        head = marshal.dumps({"ident": ident, "skeleton": skeleton, "slices": [len(b) for b in slices]}, 4)
        d = index_dir()
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{name}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(MAGIC + len(head).to_bytes(_HEAD, "little") + head)
            f.writelines(slices)
        os.replace(tmp, d / f"{name}.marshal")
        return True
    except (OSError, ValueError):
        return False


def export_gguf(g) -> dict:
    meta = {}
    for k, v in g.metadata.items():
        # marshal has no array.array: keep it as (typecode, bytes), rebuilt without a copy loop.
        meta[k] = ("__array__", v.typecode, v.tobytes()) if isinstance(v, array.array) else v
    return {"version": g.version, "alignment": g.alignment, "data_offset": g.data_offset, "metadata": meta,
            "tensors": [tuple(t) for t in g.tensors.values()]}


def restore_metadata(meta: dict) -> dict:
    out = {}
    for k, v in meta.items():
        if isinstance(v, tuple) and len(v) == 3 and v[0] == "__array__":
            a = array.array(v[1])
            a.frombytes(v[2])
            v = a
        out[k] = v
    return out
