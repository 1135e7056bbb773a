"""The GPU's idle power, which the record's net energy subtracts (gross - idle watts x window).

What "idle" must mean: the power the GPU draws with no process on it, before ours started. NVML
cannot tell us that from inside a cold start: by the time it answers, the process has already
woken the GPU. Measured on H200s (results/2026-12-01-h200-s2, 10 runs each, idle 76.7-82.7 W):
NVML's instantaneous power read first thing when NVML comes up gave 130.5 W beside cuInit (the
default) and 122.3 W with NVML up before cuInit (REFLEX_NVML_START=before_context); its plain
power reading, a one-second average, ~134 W. So idle comes from outside the cold start, best first:
  env          REFLEX_IDLE_WATTS, set by whoever measured it (e.g. in a function's template);
  calibrated   `reflex doctor` sampled the instantaneous power with no process on the GPU and
               cached the median per GPU (by UUID) in <cache>/idle_power.json.
With neither, the net figure is null and the record says why (`energy_net_error`): a number that
is wrong by half is worse than none. The record names the source (`idle_watts_source`). The
lookup runs when the record is built, after the first token (EnergyMeter.resolve_idle): at NVML
start it lengthened that thread from 46 to 124 ms on the H200, beside the cold path's imports.
"""

from __future__ import annotations

import ctypes
import json
import os
import statistics
import time

NVML_FI_DEV_POWER_INSTANT = 186  # nvml.h: instantaneous power, mW
ENV = "REFLEX_IDLE_WATTS"
CALIBRATION_FILE = "idle_power.json"


class _NvmlValue(ctypes.Union):
    _fields_ = [("dVal", ctypes.c_double), ("uiVal", ctypes.c_uint), ("ulVal", ctypes.c_ulong),
                ("ullVal", ctypes.c_ulonglong), ("sllVal", ctypes.c_longlong), ("siVal", ctypes.c_int)]


class _NvmlFieldValue(ctypes.Structure):  # nvmlFieldValue_t
    _fields_ = [("fieldId", ctypes.c_uint), ("scopeId", ctypes.c_uint), ("timestamp", ctypes.c_longlong),
                ("latencyUsec", ctypes.c_longlong), ("valueType", ctypes.c_int), ("nvmlReturn", ctypes.c_int),
                ("value", _NvmlValue)]


_VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}


def instant_watts(nvml, handle) -> float | None:
    """NVML's instantaneous power (not the one-second average nvmlDeviceGetPowerUsage gives on
    recent GPUs), or None where the driver lacks the field."""
    fv = _NvmlFieldValue(fieldId=NVML_FI_DEV_POWER_INSTANT)
    try:
        if nvml.nvmlDeviceGetFieldValues(handle, 1, ctypes.byref(fv)) != 0 or fv.nvmlReturn != 0:
            return None
    except AttributeError:  # an NVML without field values
        return None
    name = _VALUE_FIELDS.get(fv.valueType)
    return None if name is None else getattr(fv.value, name) / 1000.0


def gpu_uuid(nvml, handle) -> str | None:
    buf = ctypes.create_string_buffer(96)
    if nvml.nvmlDeviceGetUUID(handle, buf, ctypes.c_uint(96)) != 0:
        return None
    return buf.value.decode(errors="replace")


def busy_processes(nvml, handle) -> int | None:
    """How many processes hold a context on the GPU (None when NVML cannot say)."""
    count = ctypes.c_uint(0)
    fn = getattr(nvml, "nvmlDeviceGetComputeRunningProcesses_v3", None)
    if fn is None:
        return None
    rc = fn(handle, ctypes.byref(count), None)  # a count query: NVML_ERROR_INSUFFICIENT_SIZE (7) when > 0
    return count.value if rc in (0, 7) else None


def calibration_path() -> str:
    from ..modelfile.embedded import model_cache_dir

    return os.path.join(str(model_cache_dir()), CALIBRATION_FILE)


def load_calibrations(path: str | None = None) -> dict:
    try:
        with open(path or calibration_path()) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def calibrated_watts(uuid: str | None, path: str | None = None) -> float | None:
    entry = load_calibrations(path).get(uuid or "")
    w = entry.get("idle_watts") if isinstance(entry, dict) else None
    return float(w) if isinstance(w, (int, float)) and 0 < w < 5000 else None


NO_IDLE = (f"no idle power for this GPU: run `reflex doctor` once on this machine (it measures and caches it) "
           f"or set {ENV}")


def resolve(env_value: str | None, calibrated: float | None) -> tuple[float | None, str | None]:
    """(watts, source): the first usable of the sources in the module docstring's order;
    (None, None) when there is none."""
    try:
        w = float(env_value) if env_value else None
    except ValueError:
        w = None
    if w is not None and 0 < w < 5000:
        return w, "env " + ENV
    if calibrated is not None and 0 < calibrated < 5000:
        return calibrated, "calibrated by reflex doctor"
    return None, None


def calibrate(nvml, handle, seconds: float = 1.0, every: float = 0.05, path: str | None = None) -> dict:
    """Sample the instantaneous power for `seconds` while no process holds the GPU, and cache the
    median for this GPU. Call before this process creates a context."""
    busy = busy_processes(nvml, handle)
    if busy:
        return {"idle_watts": None, "error": f"{busy} process(es) hold the GPU: its idle power was not measured"}
    samples = []
    end = time.monotonic() + seconds
    while not samples or time.monotonic() < end:  # at least one sample, however short the span
        w = instant_watts(nvml, handle)
        if w is None:
            return {"idle_watts": None, "error": "NVML has no instantaneous power field on this GPU/driver"}
        samples.append(w)
        time.sleep(every)
    uuid = gpu_uuid(nvml, handle)
    entry = {"idle_watts": round(statistics.median(samples), 2), "samples": len(samples),
             "spread_watts": round(max(samples) - min(samples), 2),
             "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path = path or calibration_path()
    data = load_calibrations(path)
    data[uuid or "unknown"] = entry
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
        entry["cached_in"] = path
    except OSError as e:
        entry["error"] = f"measured but not cached: {e}"
    return dict(entry, gpu_uuid=uuid)
