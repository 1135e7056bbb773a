"""GPU energy from process start to a mark (the first token), from NVML's total-energy counter.

NVML is read through ctypes: the `pynvml` module costs ~0.1 s of GIL-holding import that the cold
path does not need. The counter (mJ since the driver loaded) does not move continuously: it steps
on a fixed period (100 ms on an H200: 99.7-100.2 ms measured in five runs), and a read returns the
value of the last step. Reading it often costs the cold path (polling every 10 ms while cuInit
runs slowed cuInit several-fold on the H200), so it is read:
  - once when NVML is up (time t_n, value V_n: the energy up to the step before t_n);
  - once at the end mark (the first token: value V_e, up to the step before the mark);
  - then every 5 ms until it steps (value V_s), on a thread: at most one period.
The step seen after the mark fixes the phase of the counter's grid: it fell between the start of
the last read that still returned V_e and the end of the first that did not (a read can take
milliseconds, and a poll waits for the GIL), taken at the middle. That dates V_n's step (tau_n, the
last grid point <= t_n) and V_e's (tau_e, a period before). Then
  measured   E(mark) - V_n over [tau_n, mark], E(mark) interpolated linearly over [tau_e, tau_e +
             period], or extrapolated back to the mark when the counter stepped between the mark
             and the read of V_e (1 run in 10 on an H200 lost its figure to that before);
  estimated from process start to tau_n (NVML cannot be read earlier) at the power NVML
             reported when it came up (`start_watts`);
and the record carries both parts, their spans and the power of the estimate. The net figure
subtracts the GPU's idle power over the window, resolved as idle_power.py says (not the power
at NVML start, which the context's work has already raised). `window_energy` is
that arithmetic, a pure function (tested with fake counters). A GPU without the counter has its
power sampled at each mark instead (coldstart.py).
"""

from __future__ import annotations

import ctypes
import os
import threading
import time

NVML_PERIOD_S = 0.1  # the H200's energy counter period (measured: see the docstring)
POLL_S = 0.005  # how often the counter is read while waiting for its step after the end mark


def open_nvml_device(index: int = 0, flags: int = 0):
    """(libnvidia-ml, device handle), or a one-line reason why not."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return "NVML not available (libnvidia-ml.so.1 not found: no NVIDIA driver)"
    rc = nvml.nvmlInitWithFlags(ctypes.c_uint(flags)) if flags else nvml.nvmlInit_v2()
    if rc != 0:
        return f"nvmlInit failed (NVML error {rc})"
    handle = ctypes.c_void_p()
    rc = nvml.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle))
    if rc != 0:
        return f"nvmlDeviceGetHandleByIndex({index}) failed (NVML error {rc})"
    return nvml, handle


class EnergyMeter:
    """NVML's energy counter and power for one GPU, read at the window's two ends."""

    def __init__(self, device_index: int = 0):
        self.method: str | None = None  # "total_energy_counter" | "power_samples" | None
        self.error: str | None = None
        self.start_watts: float | None = None  # NVML's (averaged) power when it came up: the estimate's
        self.idle_watts: float | None = None  # what the net figure subtracts (resolve_idle)
        self.idle_source: str | None = None
        self._nvml = None
        self._handle = None
        self._device_index = device_index
        self.start_read: tuple[float, int] | None = None  # (t_n, V_n)
        self.end_reads: list[tuple[float, int]] = []  # (t, V) at the end mark, then the step after it
        self.end_read_at: float | None = None  # when the end mark's read returned
        self.last_unstepped_at: float | None = None  # when the last read still returning V_e began
        self._end_done = threading.Event()

    # -- NVML -----------------------------------------------------------------------------

    def start(self, clock, flags: int = 0) -> None:
        """Load libnvidia-ml, open the device, read the power and the counter once."""
        opened = open_nvml_device(self._device_index, flags)
        if isinstance(opened, str):
            self.error = opened
            return
        self._nvml, self._handle = opened
        self._ready(clock)

    def _ready(self, clock) -> None:
        """NVML is open: the power now, which method, the first counter read. Nothing else: this
        thread runs beside the cold path's imports, and its Python holds their GIL."""
        self.start_watts = self.power_watts()
        v = self.counter_mj()
        if v is not None:
            self.method = "total_energy_counter"
            self.start_read = (clock(), v)
        elif self.start_watts is not None:
            self.method = "power_samples"
        else:
            self.error = "NVML reports neither the energy counter nor power on this GPU"

    def resolve_idle(self) -> None:
        """The idle power the net figure subtracts (idle_power.py), read when the record is built,
        after the first token: the calibration lookup costs the cold path nothing then."""
        if self._nvml is None or self.idle_source is not None:
            return
        from . import idle_power

        uuid = idle_power.gpu_uuid(self._nvml, self._handle)
        self.idle_watts, self.idle_source = idle_power.resolve(os.environ.get(idle_power.ENV),
                                                               idle_power.calibrated_watts(uuid))

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

    # -- the end of the window --------------------------------------------------------------

    def mark_end(self, clock, t_end: float, max_wait_s: float = 2.5 * NVML_PERIOD_S) -> None:
        """At the end mark: read the counter now and, on a thread, again every POLL_S until it
        steps (at most max_wait_s). Only the first call counts."""
        if self.method != "total_energy_counter" or self.end_reads or self._end_done.is_set():
            return
        self.end_reads = [(t_end, self.counter_mj())]
        self.end_read_at = clock()  # the read may return after a step past the mark

        def wait_step():
            try:
                first = self.end_reads[0][1]
                last_old = t_end  # the read of V_e began at the mark
                deadline = clock() + max_wait_s
                while clock() < deadline:
                    time.sleep(POLL_S)
                    began = clock()
                    v = self.counter_mj()
                    if v is not None and v != first:
                        self.last_unstepped_at = last_old
                        self.end_reads.append((clock(), v))
                        return
                    last_old = began
            finally:
                self._end_done.set()

        threading.Thread(target=wait_step, name="reflex-energy", daemon=True).start()

    def end_window(self, timeout: float = 3 * NVML_PERIOD_S) -> list[tuple[float, int]]:
        """The end reads, once the step after the end mark was seen (or the wait gave up)."""
        self._end_done.wait(timeout)
        return list(self.end_reads)


def window_energy(start: tuple[float, int] | None, end: list[tuple[float, int]], start_watts: float | None,
                  period: float = NVML_PERIOD_S, poll: float = POLL_S, idle_watts: float | None = None,
                  end_read_at: float | None = None, last_unstepped_at: float | None = None) -> dict:
    """Joules from process start (t = 0) to the end mark, from the start read (t_n, V_n) and the
    end reads [(t_end, V_e), (t_s, V_s)] (see the module docstring); the span before NVML at
    start_watts; with idle_watts, the net figure (`joules_above_idle`) less it over the window.
    end_read_at: when the read of V_e returned (default t_end); last_unstepped_at: when the last
    read that still returned V_e began (default one poll before t_s, t_s being when the first
    read of V_s returned)."""
    out = {"joules": None, "measured_joules": None, "measured_from_ms": None, "estimated_joules": None,
           "estimated_span_ms": None, "estimated_watts": None, "estimated_from": None,
           "counter_period_ms": round(period * 1000, 1), "end_interpolated_over_ms": None, "error": None}
    if start is None:
        out["error"] = "the energy counter was not read when NVML came up"
        return out
    if len(end) < 2:
        out["error"] = "the energy counter did not step after the end of the window"
        return out
    (t_n, v_n), ((t_end, v_e), (t_s, v_s)) = start, end[:2]
    t_read = t_end if end_read_at is None else end_read_at
    t_old = t_s - poll if last_unstepped_at is None else last_unstepped_at
    half = (t_s - t_old) / 2  # how well the step is dated
    step = t_s - half  # when the counter stepped
    tau_e = step - period  # the step whose value V_e holds: before its read returned
    if t_n >= t_end or t_read < t_end or half > period / 2 or tau_e > t_read + max(poll, half + 1e-3):
        out["error"] = "the counter reads around the window are out of order"
        return out
    tau_n = step - period * max(1, -(-(step - t_n) // period))  # the last grid point <= t_n
    # E(mark) on the line from (tau_e, V_e) to (tau_e + period, V_s): back past tau_e when the
    # counter stepped after the mark, before V_e was read
    e_end = v_e + (v_s - v_e) * min(max((t_end - tau_e) / period, -1.0), 1.0)
    t_from = max(tau_n, 0.0)
    measured = (e_end - v_n) / 1000
    if tau_n < 0:  # NVML read the counter less than a period after process start: prorate
        measured *= (t_end - 0.0) / (t_end - tau_n)
    estimated = (start_watts or 0.0) * t_from
    out.update(joules=round(measured + estimated, 3), measured_joules=round(measured, 3),
               measured_from_ms=round(t_from * 1000, 3), estimated_joules=round(estimated, 3),
               estimated_span_ms=round(t_from * 1000, 3), estimated_watts=start_watts if t_from > 0 else None,
               estimated_from="power at NVML start" if t_from > 0 else None,
               end_interpolated_over_ms=round(period * 1000, 1))
    if idle_watts is not None:
        out["joules_above_idle"] = round(out["joules"] - idle_watts * t_end, 3)
    return out
