"""Which drivers the kernels and bindings run on (reflex_runtime/gpu/compat.py, docs/DEPLOY.md
"Driver versions"): the pure rules, and that the driver layer uses only names both the 12.x and
13.x bindings have (checked here against the installed one; 12.9.10 and 13.5.0 were compared by
hand: the same 43 names and the same 34 function signatures)."""

from __future__ import annotations

import os
import re

import pytest

from reflex_runtime.gpu.compat import driver_problem, nvcc_cuda_version

NVCC_12_8 = "Build cuda_12.8.r12.8/compiler.35583870_0"
NVCC_13_0 = "Build cuda_13.0.r13.0/compiler.36424714_0"


def test_nvcc_version_from_the_manifest_line():
    assert nvcc_cuda_version(NVCC_12_8) == (12, 8)
    assert nvcc_cuda_version(NVCC_13_0) == (13, 0)
    assert nvcc_cuda_version(None) is None and nvcc_cuda_version("garbage") is None


@pytest.mark.parametrize("driver, nvcc, bindings, fmt, needle", [
    (12040, NVCC_12_8, "12.9.10", "sass", None),  # the image on a CUDA 12.4 driver (R550)
    (12000, NVCC_12_8, "12.9.10", "sass", None),  # minor version compatibility down to 12.0
    (13000, NVCC_12_8, "12.9.10", "sass", None),  # CUDA 12 builds on a CUDA 13 driver
    (13000, NVCC_13_0, "13.5.0", "sass", None),
    (13000, NVCC_12_8, "13.5.0", "ptx", None),
    (12040, NVCC_12_8, "13.5.0", "sass", "install `reflex-runtime[cu12]`"),
    (12040, NVCC_13_0, "12.9.10", "sass", "built by a CUDA 13.0 nvcc and this driver supports CUDA 12.4"),
    (12040, NVCC_12_8, "12.9.10", "ptx", "cannot compile it"),  # PTX 8.7 on a 12.4 driver
    (12080, NVCC_12_8, "12.9.10", "ptx", None),
    (12040, None, None, "sass", None),  # nothing known: no objection
])
def test_driver_problem(driver, nvcc, bindings, fmt, needle):
    why = driver_problem(driver, nvcc, bindings, fmt)
    if needle is None:
        assert why is None
    else:
        assert why is not None and needle in why and "\n" not in why, why


def test_the_driver_layer_uses_names_the_installed_bindings_have():
    from cuda.bindings import driver as cu

    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reflex_runtime", "gpu")
    src = "".join(open(os.path.join(root, f)).read() for f in ("driver.py", "bootstrap.py"))
    names = set(re.findall(r"\bcu\.([A-Za-z_][\w.]*)", src))
    assert len(names) > 30
    for name in sorted(names):
        obj = cu
        for part in name.split("."):
            obj = getattr(obj, part)  # AttributeError names the missing one
