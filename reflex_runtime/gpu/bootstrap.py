"""Bring the GPU up on background threads from the first moments of the process.

cuInit and primary-context creation take ~0.25-0.34 s and release the GIL, and so does NVML
start-up, so they run beside the main thread's GGUF parsing and tokenizer construction.
The device thread also reads the fatbin, loads it with one cuModuleLoadData and resolves every
kernel in the table. Each step is a span on the timeline; any failure becomes `error` (one
line) and the caller falls back to the CPU reference (or fails, with --backend cuda).
"""

from __future__ import annotations

import ctypes
import json
import os
import threading

_KERNEL_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_kernels")


def kernels_dir() -> str:
    return os.environ.get("REFLEX_KERNELS_DIR") or _KERNEL_DIR


def read_manifest() -> dict | None:
    try:
        with open(os.path.join(kernels_dir(), "manifest.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def fatbin_is_stale(manifest: dict) -> bool | None:
    """In a source checkout: do kernels/*.cu still match what the fatbin was built from?
    None when the sources are not here (an installed wheel)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = os.path.join(root, "scripts", "build_kernels.py")
    if not (os.path.isfile(script) and os.path.isdir(os.path.join(root, "kernels"))):
        return None
    import importlib.util

    spec = importlib.util.spec_from_file_location("reflex_build_kernels", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.sources_digest(root) != manifest.get("sources_sha256")


def kernel_format(cc: tuple[int, int], manifest: dict) -> str | None:
    """'sass' when the fatbin has machine code for this GPU, 'ptx' when the driver must JIT the
    PTX (a GPU newer than every listed architecture), None when nothing can run on it."""
    arch = cc[0] * 10 + cc[1]
    if f"sm_{arch}" in manifest.get("sass", []):
        return "sass"
    ptx = int(manifest.get("ptx", "compute_0").split("_")[1])
    if arch >= ptx:
        return "ptx"
    return None


class DeviceBootstrap:
    def __init__(self, timeline, ordinal: int = 0):
        self.tl = timeline
        self.ordinal = ordinal
        self.device = None
        self.stream = None
        self.error: str | None = None
        self.kernel_format: str | None = None
        self.energy_started = False
        self._ready = threading.Event()
        self._context_started = threading.Event()

    @classmethod
    def start(cls, timeline, ordinal: int = 0) -> "DeviceBootstrap":
        boot = cls(timeline, ordinal)
        threading.Thread(target=boot._energy, name="reflex-nvml", daemon=True).start()
        threading.Thread(target=boot._early_context, name="reflex-context", daemon=True).start()
        threading.Thread(target=boot._bring_up, name="reflex-device", daemon=True).start()
        return boot

    def _early_context(self) -> None:
        """cuInit and the primary context straight through libcuda with ctypes, so the ~0.3 s they
        take (GIL released) overlaps the import of cuda.bindings on the device thread; the
        bindings' own cuInit and context retain then return at once."""
        if nvml_start_mode() == "before_context":
            self._start_energy()
        t = self.tl.elapsed()
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            if lib.cuInit(0) == 0:
                dev, ctx = ctypes.c_int(), ctypes.c_void_p()
                if lib.cuDeviceGet(ctypes.byref(dev), self.ordinal) == 0:
                    lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
                    self.tl.span("cuda_init_context", t, self.tl.elapsed())
        except (OSError, AttributeError):
            pass  # no driver: the device thread says so
        finally:
            self._context_started.set()

    def _energy(self) -> None:
        """NVML beside cuInit (the default): the energy counter is read from the first moments.
        REFLEX_NVML_START (measured against each other in results/2026-11-30-h200):
          before_context  NVML first, then cuInit, on the context thread (both touch the driver);
          after_context   NVML once the context exists: cuInit alone, but a request answered in
                          under ~0.45 s may finish before the meter starts (energy then null)."""
        mode = nvml_start_mode()
        if mode == "before_context":
            return  # _early_context starts it
        if mode == "after_context":
            self._context_started.wait()
        self._start_energy()

    def _start_energy(self) -> None:
        self.tl.nvml_start = nvml_start_mode()
        self.tl.start_energy(self.ordinal, nvml_init_flags())
        self.energy_started = True

    def _bring_up(self) -> None:
        tl = self.tl
        try:
            t = tl.elapsed()
            manifest = read_manifest()
            if manifest is None:
                self.error = (f"CUDA kernels are not built (no manifest in {kernels_dir()}); "
                              "run `python scripts/build_kernels.py` or reinstall with nvcc available")
                return
            with open(os.path.join(kernels_dir(), manifest.get("fatbin", "reflex.fatbin")), "rb") as f:
                image = f.read()
            try:
                from .driver import Device
            except ImportError as e:
                self.error = f"cuda-bindings is not importable ({e})"
                return
            tl.span("import_cuda_bindings", t, tl.elapsed())
            self._context_started.wait()
            t = tl.elapsed()
            try:
                dev = Device(self.ordinal)
            except Exception as e:  # DeviceError, or the bindings' "no libcuda" loader error
                self.error = _no_gpu_reason(e)
                return
            tl.span("device_open", t, tl.elapsed())
            fmt = kernel_format(dev.cc, manifest)
            if fmt is None:
                self.error = (f"{dev.name} is sm_{dev.cc[0]}{dev.cc[1]}; the fatbin carries {', '.join(manifest['sass'])} "
                              f"and {manifest['ptx']} PTX")
                return
            from .compat import driver_problem

            self.error = driver_problem(dev.driver_version, manifest.get("nvcc"), _bindings_version(), fmt)
            if self.error:
                return
            t = tl.elapsed()
            dev.load_fatbin(image)
            self.stream = dev.stream()
            tl.span("fatbin_load", t, tl.elapsed())
            self.kernel_format = fmt
            self.device = dev
        except Exception as e:  # never let the thread die silently: the main thread reads .error
            self.error = f"GPU bring-up failed: {type(e).__name__}: {' '.join(str(e).split())}"
        finally:
            self._ready.set()

    def wait(self, timeout: float | None = 60.0):
        """The Device, or None with `error` set."""
        if not self._ready.wait(timeout):
            self.error = "GPU bring-up did not finish in time"
            return None
        if self.device is not None:
            self.device.make_current()
        return self.device


def _bindings_version() -> str | None:
    try:
        from cuda.bindings import __version__

        return __version__
    except ImportError:
        return None


def nvml_start_mode() -> str:
    mode = os.environ.get("REFLEX_NVML_START", "early")
    return mode if mode in ("early", "before_context", "after_context") else "early"


def nvml_init_flags() -> int:
    """REFLEX_NVML_FLAGS: nvmlInitWithFlags flags for measuring start-up variants (2 =
    NVML_INIT_FLAG_NO_ATTACH: attach only the device we open). 0: plain nvmlInit_v2."""
    v = os.environ.get("REFLEX_NVML_FLAGS", "0")
    return int(v) if v.isdigit() else 0


def _no_gpu_reason(e: Exception) -> str:
    text = " ".join(str(e).split())
    if "NVIDIA driver library" in text or "libcuda" in text or type(e).__name__ == "DynamicLibNotFoundError":
        return "no NVIDIA driver on this machine (libcuda.so not found)"
    if "NO_DEVICE" in text:
        return "the NVIDIA driver reports no CUDA device"
    return f"CUDA initialisation failed: {text}"
