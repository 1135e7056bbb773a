"""The AOT build: one fatbin with SASS for every listed architecture and PTX for the newest, and
every kernel of the table in each (checked with cuobjdump from the nvidia-cuda-cuobjdump wheel)."""

import glob
import json
import os
import re
import shutil
import subprocess
import sysconfig

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KDIR = os.path.join(ROOT, "reflex_runtime", "_kernels")


def cuobjdump():
    found = shutil.which("cuobjdump")
    if found:
        return found
    purelib = sysconfig.get_paths()["purelib"]
    for c in sorted(glob.glob(os.path.join(purelib, "nvidia", "*", "bin", "cuobjdump"))):
        return c
    return None


@pytest.fixture(scope="module")
def built():
    import build_kernels

    if build_kernels.find_nvcc() is None:
        pytest.skip("no nvcc on this machine: the kernels cannot be built here (CI has nvcc)")
    manifest_path = os.path.join(KDIR, "manifest.json")
    assert os.path.exists(manifest_path), "nvcc is here but the fatbin was not built by `pip install -e .`"
    with open(manifest_path) as f:
        manifest = json.load(f)
    assert manifest["sources_sha256"] == build_kernels.sources_digest(ROOT), "the fatbin is stale: rebuild it"
    return manifest


def test_manifest_lists_the_kernel_table_and_archs(built):
    from reflex_runtime.gpu.ops import kernel_names

    assert set(built["kernels"]) == set(kernel_names())
    assert {"sm_75", "sm_80", "sm_86", "sm_89", "sm_90"} <= set(built["sass"])
    assert built["ptx"] == "compute_" + built["sass"][-1].split("_")[1]  # PTX for the newest listed arch


def test_every_kernel_is_in_every_arch(built):
    tool = cuobjdump()
    assert tool, "cuobjdump not found: pip install nvidia-cuda-cuobjdump (a dev dependency)"
    fatbin = os.path.join(KDIR, built["fatbin"])
    out = subprocess.run([tool, "--dump-resource-usage", fatbin], capture_output=True, text=True, check=True).stdout
    per_arch: dict[str, set] = {}
    arch = None
    for line in out.splitlines():
        m = re.search(r"arch = (sm_\d+)", line)
        if m:
            arch = m.group(1)
            per_arch.setdefault(arch, set())
        m = re.match(r"\s*Function (\w+):", line)
        if m and arch:
            per_arch[arch].add(m.group(1))
    assert set(per_arch) == set(built["sass"]), f"SASS present for {sorted(per_arch)}"
    for a, names in per_arch.items():
        missing = set(built["kernels"]) - names
        assert not missing, f"{a} lacks {sorted(missing)}"
    ptx = subprocess.run([tool, "--list-ptx", fatbin], capture_output=True, text=True, check=True).stdout
    assert built["ptx"].split("_")[1] in ptx.replace("sm_", "").replace("compute_", "")
