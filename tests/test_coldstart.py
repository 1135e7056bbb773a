"""The cold-start timeline and its energy fields (no GPU needed)."""

import json
import os
import subprocess
import sys
import time

import pytest

from reflex_runtime import coldstart, energy
from reflex_runtime.coldstart import Timeline
from reflex_runtime.energy import EnergyMeter, window_energy

RECORD_FIELDS = {
    "t0_source", "t0_resolution_ms", "python_started_ms", "stages", "total_ms", "background",
    "process_start_to_first_token_ms", "model_page_cache_resident", "joules_process_start_to_first_token",
    "joules_above_idle_process_start_to_first_token", "energy_measured_joules", "energy_measured_from_ms",
    "energy_estimated_joules", "energy_estimated_span_ms", "energy_estimated_watts", "energy_estimated_from",
    "energy_counter_period_ms", "energy_stage_joules", "energy_method", "energy_nvml_start", "idle_watts",
    "energy_error",
}


def test_t0_is_the_process_start_not_the_first_python_line():
    tl = Timeline()
    assert tl.t0_source == "proc_self_stat_starttime"
    # the interpreter had already been running before this object existed
    assert tl.t_created - tl.t0 > 0
    with open("/proc/self/stat") as f:
        assert f.read()  # the source we claim exists


def test_record_has_every_field_and_stages_sum_to_total():
    tl = Timeline()
    tl.no_energy("no GPU in this test")
    for name in ("model_resolved", "gguf_open", "tokenizer", "weights_loaded", "prompt", "first_token"):
        time.sleep(0.002)
        tl.mark(name)
    tl.span("cuda_init_context", 0.01, 0.02)
    rec = tl.record()
    assert RECORD_FIELDS <= set(rec)
    ats = [s["at_ms"] for s in rec["stages"]]
    assert ats == sorted(ats) and all(s["ms"] >= 0 for s in rec["stages"])
    assert abs(sum(s["ms"] for s in rec["stages"]) - rec["total_ms"]) < 0.01
    assert rec["process_start_to_first_token_ms"] == rec["stages"][-1]["at_ms"]
    assert rec["background"]["cuda_init_context"] == {"start_ms": 10.0, "end_ms": 20.0}
    json.dumps(rec)  # JSON-able


def test_energy_fields_are_null_with_a_reason_without_nvml(monkeypatch):
    import ctypes

    real = ctypes.CDLL

    def no_nvml(name, *a, **kw):
        if "nvidia-ml" in str(name):
            raise OSError(f"{name}: cannot open shared object file")
        return real(name, *a, **kw)

    monkeypatch.setattr(energy.ctypes, "CDLL", no_nvml)
    tl = Timeline()
    tl.start_energy()
    tl.mark("first_token")
    rec = tl.record()
    for k in ("joules_process_start_to_first_token", "joules_above_idle_process_start_to_first_token", "idle_watts",
              "energy_method", "energy_measured_joules", "energy_estimated_joules"):
        assert rec[k] is None
    assert "NVML not available" in rec["energy_error"]


def counter_log(watts, t_first_read, t_stop, period=0.1, phase=0.037, poll=0.01, mj0=5_000_000):
    """What EnergyMeter.start_log records for a counter that steps every `period` s (first step at
    `phase`), holding the energy at each step: (first read, value) then each change, seen up to one
    poll late. watts(t0, t1) -> joules between t0 and t1."""
    steps = [phase + i * period for i in range(int((t_stop - phase) / period) + 1)]

    def value(t):
        last = max((s for s in steps if s <= t), default=None)
        return mj0 + (round(1000 * watts(0.0, last)) if last is not None else 0)

    log = [(t_first_read, value(t_first_read))]
    for s in steps:
        if s > t_first_read:
            log.append((s + poll / 2, value(s)))  # the logger notices a change within one poll
    return log


def test_constant_power_is_recovered_from_process_start():
    """150 W from t = 0: whatever the phase of the counter and however late NVML comes up, the
    measured part plus the estimated part equal 150 W x the window."""
    for t_read, phase, t_end in ((0.12, 0.037, 0.48), (0.40, 0.091, 0.45), (0.05, 0.002, 1.3), (0.31, 0.055, 0.33)):
        log = counter_log(lambda a, b: 150 * (b - a), t_read, t_end + 0.25, phase=phase)
        e = window_energy(log, t_end, idle_watts=100.0)
        assert e["error"] is None
        assert e["joules"] == pytest.approx(150 * t_end, abs=150 * 0.006), (t_read, phase, e)
        assert e["joules_above_idle"] == pytest.approx(50 * t_end, abs=1.0)
        # the measured window starts at the counter tick before NVML's first read
        assert e["measured_from_ms"] / 1000 == pytest.approx(max(t_read - ((t_read - phase) % 0.1), 0), abs=0.012)
        assert e["estimated_span_ms"] == e["measured_from_ms"]
        assert e["estimated_from"] == ("first counter interval" if e["estimated_span_ms"] > 0 else None)
        assert e["counter_period_ms"] == pytest.approx(100, abs=1)


def test_the_span_before_nvml_is_estimated_and_labelled():
    """80 W until 0.35 s, then 300 W: the part before the first counter interval is an estimate
    at that interval's power, and the record says how long and at what power."""
    def watts(a, b):
        lo, hi = min(b, 0.35), max(a, 0.35)
        return 80 * max(0.0, lo - a) + 300 * max(0.0, b - hi)

    log = counter_log(watts, 0.30, 0.9, phase=0.02)
    e = window_energy(log, 0.6, idle_watts=80.0)
    true = watts(0.0, 0.6)
    assert e["estimated_span_ms"] == pytest.approx(220, abs=12)  # the tick at 0.22 s preceded the read
    assert e["measured_joules"] == pytest.approx(watts(e["measured_from_ms"] / 1000, 0.6), abs=1.5)
    assert e["estimated_watts"] == pytest.approx(80, abs=2)  # the first interval (0.22-0.32 s) ran at 80 W
    assert e["joules"] == pytest.approx(true, abs=2.5)


def test_stage_joules_only_where_the_counter_resolves_them():
    log = counter_log(lambda a, b: 200 * (b - a), 0.05, 1.2, phase=0.01)
    stages = [("long", 0.10, 0.50), ("short", 0.50, 0.53), ("before_window", 0.0, 0.02)]
    e = window_energy(log, 0.9, idle_watts=100.0, stages=stages)
    assert e["stage_joules"]["long"] == pytest.approx(80.0, abs=1.5)
    assert e["stage_joules"]["short"] is None  # shorter than a counter period
    assert e["stage_joules"]["before_window"] is None  # not measured


def test_missing_ticks_are_an_error_not_a_number():
    assert window_energy([(0.2, 5)], 0.3, 100.0)["error"]
    e = window_energy(counter_log(lambda a, b: 100 * (b - a), 0.1, 0.3), 0.5, 100.0)
    assert e["joules"] is None and "did not tick after" in e["error"]


class FakeMeter(EnergyMeter):
    """EnergyMeter over a fake counter that steps every 20 ms at a constant 150 W since `born`."""

    def __init__(self, born):
        super().__init__()
        self.born = born

    def start(self, flags=0):
        self.method, self.idle_watts = "total_energy_counter", 100.0

    def counter_mj(self):
        return 5_000_000 + int((time.monotonic() - self.born) / 0.02) * 3000  # 3 J per 20 ms = 150 W


def test_timeline_record_covers_process_start_to_first_token(monkeypatch):
    """End to end through the logger thread, with NVML coming up 0.15 s after the timeline's t0."""
    tl = Timeline()
    tl.t0 = coldstart.now_boottime()  # a process that starts now
    born = time.monotonic()  # ... with a fake counter at 150 W since then
    monkeypatch.setattr("reflex_runtime.coldstart.EnergyMeter", lambda index=0: FakeMeter(born))
    time.sleep(0.15)
    tl.start_energy()
    time.sleep(0.2)
    tl.mark("first_token")
    rec = tl.record()
    assert rec["energy_error"] is None, rec["energy_error"]
    t_first = rec["process_start_to_first_token_ms"] / 1000
    # the estimate of the first 0.15 s rests on the counter period seen through 10 ms polling
    assert rec["joules_process_start_to_first_token"] == pytest.approx(150 * t_first, abs=3.0)
    assert rec["joules_above_idle_process_start_to_first_token"] == pytest.approx(50 * t_first, abs=3.0)
    assert rec["energy_estimated_span_ms"] > 100  # NVML was not up for the first 150 ms
    assert rec["energy_measured_joules"] + rec["energy_estimated_joules"] == pytest.approx(
        rec["joules_process_start_to_first_token"], abs=0.01)


def test_cli_summary_line_and_json_record_from_a_real_process(tmp_path):
    """A real `reflex generate` on the embedded model: the record is complete and consistent."""
    rec_path = tmp_path / "rec.json"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    r = subprocess.run([sys.executable, "-m", "reflex_runtime.cli", "generate", "The capital of France is",
                        "-n", "2", "--backend", "cpu", "--record", str(rec_path)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "process_start_to_first_token_ms=" in r.stderr and "joules_process_start_to_first_token=null" in r.stderr
    rec = json.loads(rec_path.read_text())
    cs = rec["coldstart"]
    assert RECORD_FIELDS <= set(cs)
    assert cs["python_started_ms"] > 0  # t0 precedes the first line of Python
    names = [s["stage"] for s in cs["stages"]]
    assert names.index("gguf_open") < names.index("tokenizer") < names.index("first_token")
    assert cs["energy_error"]  # the reason energy is null (CPU backend)
