"""GPU energy from process start to a mark (the first token), from NVML's total-energy counter.

NVML is read through ctypes: the `pynvml` module costs ~0.1 s of GIL-holding import that the cold
path does not need. The counter (mJ since the driver loaded) does not move continuously: on an
H200 it steps every ~100 ms, by ~12 J at idle. So what the record can know is:

  measured   from the counter tick just before our first read to the mark. A thread logs the
             time of every counter change while the window is open; the first change we see
             dates the tick before it (one counter period earlier), and the energy at the mark
             is interpolated linearly between the ticks around it (the record waits for the one
             after it, at most one period).
  estimated  from process start to the start of the measured window (the GPU cannot be read
             before NVML is up), at the average power of the first measured counter interval,
             or the idle power when there is none; the span, the power and where it came from
             are in the record.

`window_energy` is the arithmetic, a pure function of the logged ticks (tested with a fake
counter). Where a GPU has no energy counter, power is sampled at each mark instead.
"""

from __future__ import annotations

import ctypes
import threading
import time

NVML_PERIOD_S = 0.1  # the counter period when too few ticks were logged to measure it (H200: ~100 ms)
POLL_S = 0.01  # how often the logger reads the counter: each read is a driver call


class EnergyMeter:
    """NVML's energy counter and power for one GPU, and a logger of counter ticks."""

    def __init__(self, device_index: int = 0):
        self.method: str | None = None  # "total_energy_counter" | "power_samples" | None
        self.error: str | None = None
        self.idle_watts: float | None = None
        self._nvml = None
        self._handle = None
        self._device_index = device_index
        self.log: list[tuple[float, int]] = []  # (time, mJ): the first read, then every change
        self._log_until: float | None = None  # stop once a change after this time is logged
        self._logging = False
        self._changed = threading.Condition()

    # -- NVML -----------------------------------------------------------------------------

    def start(self, flags: int = 0) -> None:
        """Load libnvidia-ml, open the device, read the idle power and whether the counter exists."""
        try:
            nvml = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError:
            self.error = "NVML not available (libnvidia-ml.so.1 not found: no NVIDIA driver)"
            return
        rc = nvml.nvmlInitWithFlags(ctypes.c_uint(flags)) if flags else nvml.nvmlInit_v2()
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
        if self.counter_mj() is not None:
            self.method = "total_energy_counter"
        elif self.idle_watts is not None:
            self.method = "power_samples"
        else:
            self.error = "NVML reports neither the energy counter nor power on this GPU"

    def counter_mj(self) -> int | None:
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

    # -- the tick log -------------------------------------------------------------------------

    def start_log(self, clock, max_s: float = 5.0, poll_s: float = POLL_S) -> None:
        """Log the counter's changes on a daemon thread until `close_window` sees a change after
        the window's end (or for at most max_s: a warm server does not poll forever)."""
        if self.method != "total_energy_counter":
            return
        self.log = [(clock(), self.counter_mj())]
        self._logging = True

        def run():
            last = self.log[0][1]
            end = clock() + max_s
            try:
                while clock() < end:
                    time.sleep(poll_s)
                    v = self.counter_mj()
                    if v is None or v == last:
                        continue
                    t, last = clock(), v
                    with self._changed:
                        self.log.append((t, v))
                        self._changed.notify_all()
                        if self._log_until is not None and t > self._log_until:
                            return
            finally:
                with self._changed:
                    self._logging = False
                    self._changed.notify_all()

        threading.Thread(target=run, name="reflex-energy", daemon=True).start()

    def close_window(self, t_end: float, timeout: float = 2.5 * NVML_PERIOD_S) -> list[tuple[float, int]]:
        """Wait (at most `timeout`) for a counter change after t_end, then stop logging; the log."""
        with self._changed:
            self._log_until = t_end
            deadline = time.monotonic() + timeout
            while self._logging and not (len(self.log) > 1 and self.log[-1][0] > t_end):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
            return list(self.log)


def window_energy(log: list[tuple[float, int]], t_end: float, idle_watts: float | None,
                  stages: list[tuple[str, float, float]] = ()) -> dict:
    """Joules from process start (t = 0) to t_end, from a tick log [(t_first_read, v0), (t1, v1),
    ...] (every entry after the first is a counter change, dated when it was seen).

    Returns measured + estimated parts as described in the module docstring, and per-stage
    joules for `stages` (name, start, end) that lie in the measured window and are at least one
    counter period long (shorter ones are below the counter's resolution: None)."""
    out = {"joules": None, "measured_joules": None, "measured_from_ms": None, "estimated_joules": None,
           "estimated_span_ms": None, "estimated_watts": None, "estimated_from": None, "counter_period_ms": None,
           "end_interpolated_over_ms": None, "stage_joules": {}, "error": None}
    ticks = log[1:]
    if not ticks:
        out["error"] = "the energy counter did not tick while the window was open"
        return out
    gaps = [b[0] - a[0] for a, b in zip(ticks, ticks[1:])]
    period = sorted(gaps)[len(gaps) // 2] if gaps else NVML_PERIOD_S  # (statistics costs 5 ms of import)
    # The first read saw the value of the tick before it; ticks are periodic, so that tick was
    # one period before the first change we saw (never later than the first read itself).
    t_first_tick = min(ticks[0][0] - period, log[0][0])
    points = [(t_first_tick, log[0][1])] + ticks  # (time, mJ): the counter, piecewise linear

    def energy_at(t: float) -> float | None:
        for (ta, va), (tb, vb) in zip(points, points[1:]):
            if ta <= t <= tb:
                return va + (vb - va) * (t - ta) / (tb - ta) if tb > ta else float(vb)
        return None

    e_end = energy_at(t_end)
    if e_end is None:
        out["error"] = ("the energy counter did not tick after the end of the window" if t_end > points[-1][0]
                        else "the window ended before the counter's first tick")
        if t_end > points[-1][0]:
            return out
    t_from = max(t_first_tick, 0.0)
    first_interval_w = (points[1][1] - points[0][1]) / 1000 / (points[1][0] - points[0][0])
    if t_end <= t_from:  # ended before the measured window began: all estimated
        measured, t_from = 0.0, t_end
    else:
        measured = (e_end - energy_at(t_from)) / 1000
    est_w, est_from = (first_interval_w, "first counter interval") if first_interval_w > 0 else (idle_watts, "idle power")
    estimated = (est_w or 0.0) * t_from
    before_end = [t for t, _ in points if t <= t_end]
    after_end = [t for t, _ in points if t >= t_end]
    out.update(joules=round(measured + estimated, 3), measured_joules=round(measured, 3),
               measured_from_ms=round(t_from * 1000, 3), estimated_joules=round(estimated, 3),
               estimated_span_ms=round(t_from * 1000, 3), estimated_watts=round(est_w, 2) if est_w else None,
               estimated_from=est_from if t_from > 0 else None, counter_period_ms=round(period * 1000, 1),
               end_interpolated_over_ms=round((min(after_end) - max(before_end)) * 1000, 1) if before_end and after_end
               else None, error=None)
    for name, a, b in stages:
        ea, eb = energy_at(a), energy_at(b)
        ok = a >= t_first_tick and ea is not None and eb is not None and b - a >= period
        out["stage_joules"][name] = round((eb - ea) / 1000, 3) if ok else None
    if idle_watts is not None:
        out["joules_above_idle"] = round(out["joules"] - idle_watts * t_end, 3)
    return out
