#!/usr/bin/env python3
"""Fetch the pinned llama-cpp-python sdist and unpack the llama.cpp files our tests use.

We use, unmodified and never committed: `convert_hf_to_gguf.py` with its `conversion/` and
`gguf-py/` folders (how real GGUF files are made), and the tokenizer test vocabularies
`models/ggml-vocab-*.gguf` with their `.inp`/`.out` vectors.

    python scripts/llama_cpp_sdist.py          # prints the unpacked llama.cpp folder

The cache lives in $REFLEX_TEST_CACHE (default ~/.cache/reflex-runtime/test).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
from pathlib import Path

VERSION = "0.3.36"
SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
_PREFIX = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
_WANTED = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", "models/ggml-vocab-", "LICENSE")


def cache_dir() -> Path:
    root = os.environ.get("REFLEX_TEST_CACHE") or os.path.join(Path.home(), ".cache", "reflex-runtime", "test")
    return Path(root)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def llama_cpp_dir() -> Path:
    """Return the unpacked llama.cpp folder, downloading and verifying the sdist on first use."""
    root = cache_dir()
    out = root / f"llama.cpp-{VERSION}"
    stamp = out / ".complete"
    if stamp.exists():
        return out
    root.mkdir(parents=True, exist_ok=True)
    # A whole-suite run unpacks from two processes at once (the tests and conftest's fixture
    # prebuild): one at a time, or one replaces the folder under the other's running converter.
    import fcntl

    with open(root / ".llama-cpp.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists():
            return out
        return _unpack(root, out, stamp)


def _unpack(root: Path, out: Path, stamp: Path) -> Path:
    sdist = root / SDIST
    if not sdist.exists() or _sha256(sdist) != SHA256:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
             f"llama-cpp-python=={VERSION}", "-d", str(root)],
            check=True,
        )
    digest = _sha256(sdist)
    if digest != SHA256:
        raise SystemExit(f"{sdist}: sha256 {digest} does not match the pinned {SHA256}")
    tmp = root / f".unpack-{os.getpid()}"
    with tarfile.open(sdist) as tar:
        members = []
        for m in tar.getmembers():
            if m.name.startswith(_PREFIX) and m.name[len(_PREFIX):].startswith(_WANTED) and (m.isfile() or m.isdir()):
                m.name = m.name[len(_PREFIX):]
                members.append(m)
        tar.extractall(tmp, members=members, filter="data")
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    stamp.write_text(SHA256 + "\n")
    return out


if __name__ == "__main__":
    print(llama_cpp_dir())
