"""Which NVIDIA drivers the kernels and the driver bindings run on, checked before the fatbin is
loaded so that a mismatch is one clear line (and a CPU fallback) instead of a driver error code.

- Kernels: SASS from a CUDA X.y nvcc loads on any driver for CUDA X.0 or newer (NVIDIA's minor
  version compatibility), not on an older major: CUDA 13 writes a new cubin ELF ABI (ABI version
  8, against 7 from CUDA 12.8; tests/test_driver_compat.py reads both). PTX from CUDA X.y needs a
  driver for X.y or newer to JIT it (only GPUs newer than every SASS target use the PTX).
- cuda-bindings X.* needs a driver for CUDA X (NVIDIA: 12.x from 525.60.13, 13.x from 580.65.06).
docs/DEPLOY.md "Driver versions" turns this into the table users read.
"""

from __future__ import annotations

import re


def nvcc_cuda_version(nvcc_line: str | None) -> tuple[int, int] | None:
    """(major, minor) from the manifest's nvcc line, e.g. 'Build cuda_12.8.r12.8/compiler.35583870_0'."""
    m = re.search(r"cuda_(\d+)\.(\d+)", nvcc_line or "")
    return (int(m[1]), int(m[2])) if m else None


def driver_problem(driver_version: int, nvcc_line: str | None, bindings_version: str | None,
                   kernel_format: str | None) -> str | None:
    """Why this driver (cuDriverGetVersion, e.g. 12040 for CUDA 12.4) cannot run these kernels
    or these bindings, or None."""
    drv = (driver_version // 1000, driver_version % 1000 // 10)
    shown = f"{drv[0]}.{drv[1]}"
    m = re.match(r"(\d+)\.", bindings_version or "")
    if m and int(m[1]) > drv[0]:
        return (f"cuda-bindings {bindings_version} needs an NVIDIA driver for CUDA {m[1]} and this driver supports "
                f"CUDA {shown}: install `reflex-runtime[cu12]` (cuda-bindings 12.x runs on CUDA 12 and 13 drivers) "
                "or update the driver")
    built = nvcc_cuda_version(nvcc_line)
    if built is None:
        return None
    if built[0] > drv[0]:
        return (f"the CUDA kernels were built by a CUDA {built[0]}.{built[1]} nvcc and this driver supports CUDA "
                f"{shown}: build them with a CUDA 12 nvcc (as the Docker image does) or update the driver")
    if kernel_format == "ptx" and built > drv:
        return (f"this GPU runs the kernels' PTX, which a CUDA {built[0]}.{built[1]} nvcc wrote, and this driver "
                f"(CUDA {shown}) cannot compile it: update the driver")
    return None
