"""Model references: what is a local path, what is a Hub reference, and that only regular files
are opened as models (a FIFO used to block `open()` forever)."""

from __future__ import annotations

import os
import time

import pytest

from reflex_runtime import cli
from reflex_runtime.errors import ModelFileError
from reflex_runtime.modelfile.gguf_file import GGUFFile
from reflex_runtime.loader import is_local_path


@pytest.mark.parametrize("ref", ["./nope.gguf", "models/x.gguf", "nope.gguf", "/abs/dir/x.gguf", "~/x.gguf",
                                 "../x.gguf", ".hidden/x", "a/b/c", "weird name.GGUF"])
def test_local_paths(ref):
    assert is_local_path(ref)


@pytest.mark.parametrize("ref", ["org/repo:Q8_0", "org/repo", "org/repo@v1:file.gguf", "org/repo:sub/x.gguf",
                                 "org/repo-GGUF:Q4_K_M"])
def test_hub_references(ref):
    assert not is_local_path(ref)


def test_an_existing_file_wins_over_a_hub_shape(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "repo").write_bytes(b"x")
    assert is_local_path("org/repo")


def _cli(*args: str) -> tuple[int, str]:
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(list(args))
    return code, err.getvalue()


@pytest.mark.parametrize("ref", ["./nope.gguf", "models/x.gguf", "nope.gguf"])
def test_missing_local_files_are_not_found(ref, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = _cli("generate", "hi", "-m", ref, "--backend", "cpu")
    assert code == 3, err
    assert err.strip() == f"reflex: error: model file not found: {ref}"


def test_a_fifo_is_refused_at_once(tmp_path):
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with pytest.raises(ModelFileError, match="not a regular file"):
        GGUFFile(fifo)
    code, err = _cli("generate", "hi", "-m", str(fifo), "--backend", "cpu")
    assert code == 3 and "not a regular file" in err, err
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("path", ["/dev/null", "/dev/zero"])
def test_devices_are_refused(path):
    with pytest.raises(ModelFileError, match="not a regular file"):
        GGUFFile(path)
