"""A per-model index cache: the parsed GGUF header and the tokenizer's lookup tables, marshalled.

Parsing a GGUF with a 151k-token vocabulary and building the tokenizer's dictionaries creates
~600k Python objects: ~0.3 s of GIL-holding work on the cold path, competing with the threads
that bring the GPU up. `marshal.loads` of the same structures takes about a third of that. The
index is keyed by the file's absolute path, size and mtime (a changed file is simply re-parsed),
written after the first request has been answered (never on the critical path), and can be
baked into a container image next to the model (`reflex pull` / the Dockerfile do this).
"""

from __future__ import annotations

import array
import hashlib
import marshal
import os
from pathlib import Path

FORMAT = 1


def index_dir() -> Path:
    from .embedded import model_cache_dir

    return Path(os.environ.get("REFLEX_INDEX_DIR") or model_cache_dir() / "index")


def _key(path: str) -> tuple[str, dict]:
    real = os.path.realpath(path)
    st = os.stat(real)
    ident = {"format": FORMAT, "path": real, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    return hashlib.sha1(real.encode()).hexdigest()[:20], ident


def load(path: str) -> dict | None:
    """The cached index for this exact file, or None (missing, stale or unreadable)."""
    if os.environ.get("REFLEX_NO_INDEX") == "1":
        return None
    try:
        name, ident = _key(path)
        with open(index_dir() / f"{name}.marshal", "rb") as f:
            payload = marshal.loads(f.read())  # marshal.load(f) reads in small pieces: 4x slower
    except (OSError, EOFError, ValueError, TypeError):
        return None
    if not isinstance(payload, dict) or payload.get("ident") != ident:
        return None
    return payload


def save(path: str, gguf, tokenizer) -> bool:
    """Write the index for this file (atomically). False when it cannot be written."""
    if os.environ.get("REFLEX_NO_INDEX") == "1":
        return False
    try:
        name, ident = _key(path)
        payload = {"ident": ident, "gguf": export_gguf(gguf), "tokenizer": tokenizer.export_tables()}
        d = index_dir()
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{name}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            marshal.dump(payload, f, 4)
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
