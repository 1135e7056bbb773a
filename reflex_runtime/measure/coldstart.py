"""The cold-start clock: one timeline from the true process start, with the GPU energy spent in it.

t0 is the kernel's record of when this process started (/proc/self/stat field 22, in clock
ticks since boot), compared against CLOCK_BOOTTIME, so interpreter start-up and imports are on
the timeline too. Its resolution is one clock tick (10 ms at CLK_TCK=100); the record says so.

Energy (energy.py) covers process start -> first token: measured from NVML's counter from the
counter step before NVML's first read, and estimated before that (NVML is not up yet), each
part and its span in the record. Where the counter is missing we integrate power sampled at the marks;
with no GPU or no NVML every energy field is null and `energy_error` says why.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import NamedTuple

from .energy import EnergyMeter, window_energy

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


class Mark(NamedTuple):
    """One point on the timeline: seconds from process start, and the GPU power then (read only
    where the GPU has no energy counter: see energy.py)."""

    name: str
    at_s: float
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
        self._lock = threading.Lock()
        self.token_times: list[float] = []
        self.page_cache_resident: float | None = None  # fraction of the model file cached at start
        self.nvml_start: str | None = None  # when NVML came up (gpu/bootstrap.py REFLEX_NVML_START)

    def elapsed(self) -> float:
        return now_boottime() - self.t0

    # -- energy ---------------------------------------------------------------------------

    END_MARKS = ("first_token", "ready")  # the energy window ends at the first of these

    def start_energy(self, device_index: int = 0, flags: int = 0) -> None:
        """Call from the background thread that brings up the GPU: NVML up, the counter read once."""
        meter = EnergyMeter(device_index)
        t = self.elapsed()
        meter.start(self.elapsed, flags)
        self.use_meter(meter)
        self.span("nvml_start", t, self.elapsed())

    def use_meter(self, meter: EnergyMeter) -> None:
        """Take a started meter (its first counter read opens the energy window)."""
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

    def _power_sample(self) -> float | None:
        """Power now, only where the GPU has no energy counter (each read is a driver call)."""
        m = self.meter
        if m is None or not self._meter_ready.is_set() or m.method != "power_samples":
            return None
        return m.power_watts()

    # -- marks ----------------------------------------------------------------------------

    def mark(self, name: str) -> float:
        t = self.elapsed()
        power = self._power_sample()
        with self._lock:
            self.marks.append(Mark(name, t, power))
        if name in self.END_MARKS and self.meter is not None and self._meter_ready.is_set():
            self.meter.mark_end(self.elapsed, t)  # read the counter now, and again when it steps
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
        """GPU joules from process start to `end_mark`: measured and estimated parts (energy.py),
        gross and above idle (the idle power as idle_power.py resolves it, named in the record)."""
        self.wait_for_meter(5.0)
        m = self.meter
        out = {
            "joules_process_start_to_first_token": None,
            "joules_above_idle_process_start_to_first_token": None,
            "energy_measured_joules": None,
            "energy_measured_from_ms": None,
            "energy_estimated_joules": None,
            "energy_estimated_span_ms": None,
            "energy_estimated_watts": None,
            "energy_estimated_from": None,
            "energy_counter_period_ms": None,
            "energy_method": m.method if m else None,
            "energy_nvml_start": self.nvml_start,
            "idle_watts": None,
            "idle_watts_source": None,
            "energy_net_error": None,
            "energy_error": (m.error if m else "energy meter was not started"),
        }
        if m is None or m.method is None:
            return out
        m.resolve_idle()
        out["idle_watts"], out["idle_watts_source"] = m.idle_watts, m.idle_source
        if m.idle_watts is None:
            from .idle_power import NO_IDLE

            out["energy_net_error"] = NO_IDLE
        t_end = self.mark_time(end_mark)
        if t_end is None:
            out["energy_error"] = f"no '{end_mark}' mark"
            return out
        if m.method == "power_samples":
            return self._energy_from_power_samples(out, m, t_end)
        end = m.end_window()
        if not end or abs(end[0][0] - t_end) > 1e-3:
            out["energy_error"] = f"the energy window closed at another mark than '{end_mark}'"
            return out
        e = window_energy(m.start_read, end, m.start_watts, idle_watts=m.idle_watts, end_read_at=m.end_read_at,
                          last_unstepped_at=m.last_unstepped_at)
        if e["error"]:
            out["energy_error"] = e["error"]
            return out
        out.update({
            "joules_process_start_to_first_token": e["joules"],
            "joules_above_idle_process_start_to_first_token": e.get("joules_above_idle"),
            "energy_measured_joules": e["measured_joules"],
            "energy_measured_from_ms": e["measured_from_ms"],
            "energy_estimated_joules": e["estimated_joules"],
            "energy_estimated_span_ms": e["estimated_span_ms"],
            "energy_estimated_watts": e["estimated_watts"],
            "energy_estimated_from": e["estimated_from"],
            "energy_counter_period_ms": e["counter_period_ms"],
            "energy_error": None,
        })
        return out

    def _energy_from_power_samples(self, out: dict, m, t_end: float) -> dict:
        """No counter: the trapezoid over the power read at each mark, the span before the first
        sample estimated at that first sample."""
        pts = [(mk.at_s, mk.power_w) for mk in sorted(self.marks, key=lambda mk: mk.at_s)
               if mk.power_w is not None and mk.at_s <= t_end]
        if not pts:
            out["energy_error"] = "no power sample inside the window"
            return out
        measured = sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in zip(pts, pts[1:]))
        estimated = pts[0][1] * pts[0][0]
        total = measured + estimated
        out.update({"joules_process_start_to_first_token": round(total, 3),
                    "energy_measured_joules": round(measured, 3), "energy_measured_from_ms": round(pts[0][0] * 1000, 3),
                    "energy_estimated_joules": round(estimated, 3), "energy_estimated_span_ms": round(pts[0][0] * 1000, 3),
                    "energy_estimated_watts": pts[0][1], "energy_estimated_from": "first power sample",
                    "energy_error": None})
        if m.idle_watts is not None:
            out["joules_above_idle_process_start_to_first_token"] = round(total - m.idle_watts * t_end, 3)
        return out

    def record(self, first_token_mark: str = "first_token") -> dict:
        """One JSON-able record of the whole timeline."""
        with self._lock:
            marks = sorted(self.marks, key=lambda m: m.at_s)
            spans = dict(self.spans)
        stages = []
        prev = 0.0
        for name, t, _ in marks:
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
