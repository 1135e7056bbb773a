"""The cold-start clock: one timeline from the true process start, with GPU energy at each mark.

t0 is the kernel's record of when this process started (/proc/self/stat field 22, in clock
ticks since boot), compared against CLOCK_BOOTTIME, so interpreter start-up and imports are on
the timeline too. Its resolution is one clock tick (10 ms at CLK_TCK=100); the record says so.

Energy comes from NVML's total-energy counter (mJ since the driver loaded), read through ctypes
on a background thread: the `pynvml` module costs ~0.1 s of GIL-holding import that the cold
path does not need. The counter only moves every ~100 ms on an H200 (in ~12 J steps), so a
poller times the counter's first tick (the window's start) and, when the record is written, the
first tick after the first token; the energy at the first token is that tick's value less the
window's average power times the time since the first token (the record waits at most one
counter period for it). Where the counter is missing we integrate sampled power between marks and say so;
with no GPU or no NVML every energy field is null and `energy_error` says why.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from typing import NamedTuple

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_start_boottime() -> float | None:
    """Seconds since boot at which this process started, or None off Linux."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[19]) / _CLK_TCK  # field 22 overall


def now_boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


class EnergyMeter:
    """GPU energy through NVML (ctypes). Every read returns mJ (counter) or None."""

    def __init__(self, device_index: int = 0):
        self.method: str | None = None  # "total_energy_counter" | "power_samples"
        self.error: str | None = None
        self.idle_watts: float | None = None
        self._nvml = None
        self._handle = None
        self._device_index = device_index

    def start(self) -> None:
        """Load libnvidia-ml, open the device and take the idle power reading."""
        try:
            nvml = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError:
            self.error = "NVML not available (libnvidia-ml.so.1 not found: no NVIDIA driver)"
            return
        rc = nvml.nvmlInit_v2()
        if rc != 0:
            self.error = f"nvmlInit failed (NVML error {rc})"
            return
        handle = ctypes.c_void_p()
        rc = nvml.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(self._device_index), ctypes.byref(handle))
        if rc != 0:
            self.error = f"nvmlDeviceGetHandleByIndex({self._device_index}) failed (NVML error {rc})"
            return
        self._nvml, self._handle = nvml, handle
        self.idle_watts = self.power_watts()
        if self._counter_mj() is not None:
            self.method = "total_energy_counter"
        elif self.idle_watts is not None:
            self.method = "power_samples"
        else:
            self.error = "NVML reports neither the energy counter nor power on this GPU"

    def _counter_mj(self) -> int | None:
        value = ctypes.c_ulonglong()
        if self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle, ctypes.byref(value)) != 0:
            return None
        return value.value

    def power_watts(self) -> float | None:
        if self._nvml is None:
            return None
        mw = ctypes.c_uint()
        if self._nvml.nvmlDeviceGetPowerUsage(self._handle, ctypes.byref(mw)) != 0:
            return None
        return mw.value / 1000.0

    def start_polling(self, clock) -> None:
        """Time the counter's first tick (polling every 10 ms on a daemon thread, for at most one
        counter period): that tick anchors the start of the energy window. Polling NVML any faster
        or for longer slows cuInit and kernel launches in this process (both contend for the
        driver), which we measured on the H200, so we poll only at the window's two ends."""
        if self.method != "total_energy_counter":
            return
        self._clock = clock
        self.tick0 = None

        def first_tick():
            last = self._counter_mj()
            end = clock() + 0.5
            while clock() < end:
                time.sleep(0.01)
                v = self._counter_mj()
                if v is not None and v != last:
                    self.tick0 = (clock(), v)
                    return

        threading.Thread(target=first_tick, name="reflex-energy", daemon=True).start()

    def next_tick(self, wait_s: float = 0.25, period_s: float = 0.002) -> tuple[float, int] | None:
        """Poll until the counter moves; (time, mJ) of that tick."""
        last = self._counter_mj()
        end = self._clock() + wait_s
        while self._clock() < end:
            time.sleep(period_s)
            v = self._counter_mj()
            if v is not None and v != last:
                return self._clock(), v
        return None

    def energy_at(self, t: float) -> tuple[float | None, float | None]:
        """(mJ at time t, span in ms it was interpolated over): the first tick after we start
        looking, less the window's average power times the time since t."""
        t0v0 = getattr(self, "tick0", None)
        if t0v0 is None:
            return None, None
        after = self.next_tick()
        if after is None:
            return None, None
        (t0, v0), (ta, va) = t0v0, after
        if ta <= t0:
            return None, None
        watts_mj = (va - v0) / (ta - t0)
        return va - watts_mj * (ta - t), round((ta - t) * 1000, 3)

    def read(self) -> tuple[int | None, float | None]:
        """(counter mJ, power W) now; the counter is None where the GPU lacks it."""
        if self._nvml is None:
            return None, None
        counter = self._counter_mj() if self.method == "total_energy_counter" else None
        return counter, (self.power_watts() if self.method == "power_samples" else None)


class Mark(NamedTuple):
    """One point on the timeline: seconds from process start, and the energy reading then."""

    name: str
    at_s: float
    energy_mj: int | None
    power_w: float | None


class Timeline:
    """Marks on one clock from process start. Main-path marks make the stages; background
    work (context creation on a thread) is recorded as spans beside them.

    The stage API for the code that drives a cold start (loader.py): `begin(stage)` names the
    stage now running, `mark(name)` records that a point was reached, and `fail()` records that
    the running stage failed (`failed_stage`), so a front end can report it. Readers use
    `marks` (Mark records), `marks_ms()`, `mark_time(name)`, `record()` and
    `wait_for_meter(timeout)`."""

    def __init__(self):
        self.t0 = process_start_boottime()
        self.t_created = now_boottime()
        if self.t0 is None:  # not Linux: fall back to the first line of Python we ran
            self.t0 = self.t_created
            self.t0_source = "first_python_line"
        else:
            self.t0_source = "proc_self_stat_starttime"
        self.marks: list[Mark] = []
        self.running_stage: str | None = None  # begin()
        self.failed_stage: str | None = None  # fail()
        self.spans: dict[str, tuple[float, float]] = {}
        self.meter: EnergyMeter | None = None
        self._meter_ready = threading.Event()
        self._energy_t0: tuple[float, int | None, float | None] | None = None
        self._lock = threading.Lock()
        self.token_times: list[float] = []
        self.page_cache_resident: float | None = None  # fraction of the model file cached at start

    def elapsed(self) -> float:
        return now_boottime() - self.t0

    # -- energy ---------------------------------------------------------------------------

    def start_energy(self, device_index: int = 0) -> None:
        """Call from the background thread that brings up the GPU."""
        meter = EnergyMeter(device_index)
        t = self.elapsed()
        meter.start()
        self.use_meter(meter, started_at=t)
        self.span("nvml_start", t, self.elapsed())

    def use_meter(self, meter: EnergyMeter, started_at: float | None = None) -> None:
        """Take a started meter: its reading now (or at `started_at`) opens the energy window."""
        counter, power = meter.read()
        self._energy_t0 = (self.elapsed() if started_at is None else started_at, counter, power)
        meter.start_polling(self.elapsed)
        self.meter = meter
        self._meter_ready.set()

    def no_energy(self, reason: str) -> None:
        meter = EnergyMeter()
        meter.error = reason
        self.meter = meter
        self._meter_ready.set()

    def wait_for_meter(self, timeout: float | None) -> bool:
        """Wait until the energy meter has started (or was declared absent); False on timeout."""
        return self._meter_ready.wait(timeout)

    def _read_energy(self) -> tuple[int | None, float | None]:
        m = self.meter
        if m is None or not self._meter_ready.is_set():
            return None, None
        return m.read()

    # -- marks ----------------------------------------------------------------------------

    def mark(self, name: str) -> float:
        t = self.elapsed()
        counter, power = self._read_energy()
        with self._lock:
            self.marks.append(Mark(name, t, counter, power))
        return t

    def begin(self, stage: str) -> None:
        """Name the stage that runs from now on (what fail() records)."""
        self.running_stage = stage

    def fail(self) -> None:
        """The running stage raised: remember which one."""
        self.failed_stage = self.running_stage

    def marks_ms(self) -> dict[str, float]:
        with self._lock:
            return {m.name: round(m.at_s * 1000, 3) for m in self.marks}

    def span(self, name: str, start: float, end: float) -> None:
        with self._lock:
            self.spans[name] = (start, end)

    def token(self) -> float:
        t = self.elapsed()
        self.token_times.append(t)
        return t

    def mark_time(self, name: str) -> float | None:
        return next((m.at_s for m in self.marks if m.name == name), None)

    # -- the record -----------------------------------------------------------------------

    def energy_between(self, end_mark: str) -> dict:
        """Joules from the first counter read to `end_mark`, gross and above idle."""
        self.wait_for_meter(5.0)
        m = self.meter
        out = {
            "joules_to_first_token": None,
            "joules_above_idle_to_first_token": None,
            "energy_window_start_ms": None,
            "energy_method": m.method if m else None,
            "energy_counter_unit_mj": 1 if m and m.method == "total_energy_counter" else None,
            "idle_watts": m.idle_watts if m else None,
            "energy_error": (m.error if m else "energy meter was not started"),
        }
        if m is None or m.method is None or self._energy_t0 is None:
            return out
        end = next(((m.at_s, m.energy_mj, m.power_w) for m in self.marks if m.name == end_mark), None)
        if end is None:
            out["energy_error"] = f"no '{end_mark}' mark"
            return out
        t_start, c_start, p_start = self._energy_t0
        t_end = end[0]
        window = t_end - t_start
        if m.method == "total_energy_counter":
            e_end, back_ms = m.energy_at(t_end)
            tick0 = getattr(m, "tick0", None)
            if e_end is None or tick0 is None:
                out["energy_error"] = "energy counter did not tick around the window"
                return out
            t_start, c_start = tick0
            window = t_end - t_start
            joules = (e_end - c_start) / 1000.0
            out["energy_extrapolated_ms"] = back_ms  # from the tick after the first token back to it
        else:  # trapezoid over the power read at each mark inside the window
            pts = [(t_start, p_start)] + [(m.at_s, m.power_w) for m in self.marks
                                          if t_start < m.at_s <= t_end and m.power_w is not None]
            joules = sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in zip(pts, pts[1:]))
        out["joules_to_first_token"] = round(joules, 3)
        if m.idle_watts is not None:
            out["joules_above_idle_to_first_token"] = round(joules - m.idle_watts * window, 3)
        out["energy_window_start_ms"] = round(t_start * 1000, 3)
        out["energy_error"] = None
        return out

    def record(self, first_token_mark: str = "first_token") -> dict:
        """One JSON-able record of the whole timeline."""
        with self._lock:
            marks = sorted(self.marks, key=lambda m: m.at_s)
            spans = dict(self.spans)
        stages = []
        prev = 0.0
        for name, t, _, _ in marks:
            stages.append({"stage": name, "ms": round((t - prev) * 1000, 3), "at_ms": round(t * 1000, 3)})
            prev = t
        first = self.mark_time(first_token_mark)
        rec = {
            "t0_source": self.t0_source,
            "t0_resolution_ms": round(1000 / _CLK_TCK, 3),
            "python_started_ms": round((self.t_created - self.t0) * 1000, 3),
            "stages": stages,
            "total_ms": round(prev * 1000, 3),
            "background": {k: {"start_ms": round(a * 1000, 3), "end_ms": round(b * 1000, 3)} for k, (a, b) in spans.items()},
            "process_start_to_first_token_ms": round(first * 1000, 3) if first is not None else None,
            "model_page_cache_resident": self.page_cache_resident,
        }
        rec.update(self.energy_between(first_token_mark))
        return rec


def fast_exit(code: int = 0) -> None:
    """Flush what we printed and leave without tearing down the CUDA context (CLI only):
    context destruction and interpreter finalization cost tens of ms and no one waits for them."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)
