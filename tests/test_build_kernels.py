"""scripts/build_kernels.py on a tree of two tiny kernel files (a copy of the real script and ops
package around them): PTX and SASS jobs per architecture in parallel with a progress line each,
one fatbin of every architecture, pieces cached by content (an unchanged tree rebuilds from the
cache, a changed header compiles again), a kernel that does not compile named in the error (and
failing the install only with REFLEX_REQUIRE_KERNELS=1), REFLEX_ARCHS, and REFLEX_SKIP_KERNELS in
the build backend."""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import build_kernels  # noqa: E402

KERNEL = """#include "{header}"
extern "C" __global__ void reflex_{name}(float* y, int n) {{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = {expr};
}}
"""


@pytest.fixture
def tree(tmp_path):
    if build_kernels.find_nvcc() is None:
        pytest.skip("no nvcc on this machine (CI has nvcc)")
    src = tmp_path / "src"
    (src / "scripts").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "scripts", "build_kernels.py"), src / "scripts")
    ops = src / "reflex_runtime" / "gpu" / "ops"
    ops.mkdir(parents=True)
    (src / "reflex_runtime" / "__init__.py").write_text("")
    (src / "reflex_runtime" / "gpu" / "__init__.py").write_text("")
    shutil.copy(os.path.join(ROOT, "reflex_runtime", "gpu", "ops", "__init__.py"), ops)
    (ops / "one.py").write_text('KERNELS = ("reflex_one",)\n')
    (ops / "two.py").write_text('KERNELS = ("reflex_two",)\n')
    k = src / "kernels"
    k.mkdir()
    (k / "value.cuh").write_text("#pragma once\n#define ONE_VALUE 1.0f\n")
    (k / "plain.cuh").write_text("#pragma once\n")
    (k / "one.cu").write_text(KERNEL.format(header="value.cuh", name="one", expr="ONE_VALUE"))
    (k / "two.cu").write_text(KERNEL.format(header="plain.cuh", name="two", expr="2.0f"))
    return src, tmp_path / "cache"


def build(src, cache, *args, env=None, check=True):
    e = {k: v for k, v in os.environ.items() if k != "REFLEX_ARCHS"}
    e.update(REFLEX_KERNEL_CACHE=str(cache), **(env or {}))
    res = subprocess.run([sys.executable, str(src / "scripts" / "build_kernels.py"), "--out", str(src / "out"), *args],
                         capture_output=True, text=True, env=e)
    if check:
        assert res.returncode == 0, res.stderr + res.stdout
    return res


def test_parallel_pieces_one_fatbin_and_the_cache(tree):
    src, cache = tree
    first = build(src, cache, "--archs", "75,90", "--jobs", "2")
    # one progress line per piece: PTX and SASS of 2 architectures, the fatbin
    lines = [ln for ln in first.stdout.splitlines() if re.match(r"reflex kernels: \[\s*\d+/5\]", ln)]
    assert len(lines) == 5, first.stdout
    assert any("PTX compute_75" in ln for ln in lines) and any("SASS sm_90" in ln for ln in lines)
    manifest = json.loads((src / "out" / "manifest.json").read_text())
    assert manifest["kernels"] == ["reflex_one", "reflex_two"]
    assert manifest["sass"] == ["sm_75", "sm_90"] and manifest["ptx"] == "compute_90"
    assert manifest["build"]["cached"] == 0
    fatbin = src / "out" / "reflex.fatbin"
    listing = subprocess.run([_cuobjdump(), "--list-elf", "--list-ptx", str(fatbin)], capture_output=True, text=True,
                             check=True).stdout
    assert "sm_75" in listing and "sm_90" in listing and ".ptx" in listing
    # the out dir is current: nothing to do
    assert "up to date" in build(src, cache, "--archs", "75,90").stdout
    # a fresh copy of the tree (what `pip install .` builds in): every piece from the cache
    built = fatbin.read_bytes()
    shutil.rmtree(src / "out")
    again = build(src, cache, "--archs", "75,90")
    assert "cached build" in again.stdout and fatbin.read_bytes() == built
    assert json.loads((src / "out" / "manifest.json").read_text())["build"]["cached"] == 5
    # one architecture of the same tree: its pieces come from the cache, only the fatbin is new
    assert "2 of 3 pieces cached" in build(src, cache, "--archs", "90").stdout
    assert "cached build" in build(src, cache, "--archs", "90", "--force").stdout
    # a header changes: everything compiles again
    (src / "kernels" / "value.cuh").write_text("#pragma once\n#define ONE_VALUE 3.0f\n")
    third = build(src, cache, "--archs", "75,90")
    assert "0 of 5 pieces cached" in third.stdout, third.stdout


def test_reflex_archs_restricts_the_architectures(tree):
    src, cache = tree
    build(src, cache, env={"REFLEX_ARCHS": "sm_90"})
    assert json.loads((src / "out" / "manifest.json").read_text())["sass"] == ["sm_90"]
    assert build_kernels.requested_archs("80, sm_90") == [80, 90] and build_kernels.requested_archs("") is None
    with pytest.raises(SystemExit, match="not 'ninety'"):
        build_kernels.requested_archs("ninety")


def test_a_kernel_that_does_not_compile_is_named(tree):
    src, cache = tree
    (src / "kernels" / "two.cu").write_text("extern \"C\" __global__ void reflex_two(float* y) { y[0] = nope; }\n")
    res = build(src, cache, "--archs", "90", check=False)
    assert res.returncode == 1 and "two.cu(1): error" in res.stderr and "nope" in res.stderr, res.stderr
    assert not (src / "out" / "reflex.fatbin").exists()
    # the install: a warning, unless REFLEX_REQUIRE_KERNELS=1 (CI) makes it fail
    script = ("import sys; sys.path.insert(0, sys.argv[1]); import build_kernels as b; "
              "b.build_for_install(sys.argv[2])")
    env = {k: v for k, v in os.environ.items() if k != "REFLEX_REQUIRE_KERNELS"}  # .ci/run sets it
    env.update(REFLEX_KERNEL_CACHE=str(cache), REFLEX_ARCHS="90")
    warn = subprocess.run([sys.executable, "-c", script, str(src / "scripts"), str(src)], capture_output=True,
                          text=True, env=env)
    assert warn.returncode == 0 and "WARNING: building the CUDA kernels failed" in warn.stderr, warn.stderr
    strict = subprocess.run([sys.executable, "-c", script, str(src / "scripts"), str(src)], capture_output=True,
                            text=True, env=dict(env, REFLEX_REQUIRE_KERNELS="1"))
    assert strict.returncode != 0 and "two.cu" in strict.stderr


def test_skip_kernels_in_the_build_backend(monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("reflex_build_test", os.path.join(ROOT, "build_backend",
                                                                                      "reflex_build.py"))
    backend = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backend)
    monkeypatch.setenv("REFLEX_SKIP_KERNELS", "1")
    monkeypatch.setattr(build_kernels, "build", lambda *a, **k: pytest.fail("REFLEX_SKIP_KERNELS=1 still built"))
    backend._build_kernels()
    assert "REFLEX_SKIP_KERNELS=1" in capsys.readouterr().err


def test_the_docker_kernel_stage_holds_what_the_names_need(tmp_path):
    """The Dockerfile's kernel stage copies only what the build reads; the kernel names must
    import from exactly those files, with no site-packages (nothing is installed there)."""
    text = open(os.path.join(ROOT, "Dockerfile")).read()
    stage = text.split("AS kernels-nvcc", 1)[1].split("\nFROM ", 1)[0]
    for line in stage.splitlines():
        parts = line.split()
        if parts[:1] != ["COPY"]:
            continue
        *srcs, dst = parts[1:]
        for s in srcs:
            if s.endswith("/"):  # a directory's contents into dst
                shutil.copytree(os.path.join(ROOT, s), tmp_path / dst, dirs_exist_ok=True)
                continue
            target = tmp_path / dst / os.path.basename(s) if dst.endswith("/") else tmp_path / dst
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(os.path.join(ROOT, s), target)
    code = "import sys; sys.path.insert(0, 'scripts'); import build_kernels as b; print(len(b.kernel_names('.')))"
    res = subprocess.run([sys.executable, "-S", "-I", "-c", code], cwd=tmp_path, capture_output=True, text=True)
    from reflex_runtime.gpu.ops import kernel_names

    assert res.returncode == 0, res.stderr
    assert int(res.stdout) == len(kernel_names()) > 200


def _cuobjdump():
    import test_fatbin

    tool = test_fatbin.cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found")
    return tool
