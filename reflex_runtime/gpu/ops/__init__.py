"""One module per kernel file: ops/<name>.py owns kernels/<name>.cu's kernel names (`KERNELS`),
its argument packs (ctypes mirrors of its structs) and the functions that launch its kernels
(`fn(L, ...)`, L a gpu.launch.Launcher: they only enqueue work on its stream). common.py mirrors
kernels/common.cuh. Adding a kernel touches its .cu and its ops module: the fatbin's manifest
(scripts/build_kernels.py), `reflex smoke` and tests/test_launch_abi.py collect the names here.

These modules import only the standard library, each other and modelfile/ggml_types.py: the kernel
build reads them before any dependency is installed.
"""

from __future__ import annotations



def kernel_modules() -> list:
    """The ops modules that own a kernel file (those with KERNELS), by name."""
    import importlib
    import pkgutil  # not at import: the cold path imports a few ops modules and needs neither

    mods = [importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__)]
    return sorted((m for m in mods if hasattr(m, "KERNELS")), key=lambda m: m.__name__)


def kernel_names() -> tuple[str, ...]:
    """Every kernel the fatbin must carry."""
    return tuple(name for m in kernel_modules() for name in m.KERNELS)
