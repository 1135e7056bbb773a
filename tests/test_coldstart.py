"""The cold-start timeline and its energy fields (no GPU needed)."""

import json
import os
import subprocess
import sys
import time

import pytest

from reflex_runtime import coldstart
from reflex_runtime.coldstart import EnergyMeter, Timeline

RECORD_FIELDS = {
    "t0_source", "t0_resolution_ms", "python_started_ms", "stages", "total_ms", "background",
    "process_start_to_first_token_ms", "model_page_cache_resident", "joules_to_first_token",
    "joules_above_idle_to_first_token", "energy_window_start_ms", "energy_method", "energy_counter_unit_mj",
    "idle_watts", "energy_error",
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

    monkeypatch.setattr(coldstart.ctypes, "CDLL", no_nvml)
    tl = Timeline()
    tl.start_energy()
    tl.mark("first_token")
    rec = tl.record()
    for k in ("joules_to_first_token", "joules_above_idle_to_first_token", "idle_watts", "energy_method"):
        assert rec[k] is None
    assert "NVML not available" in rec["energy_error"]


class FakeCounter(EnergyMeter):
    """An energy counter that moves every 20 ms at a constant 150 W, like NVML's (slower) one."""

    def __init__(self):
        super().__init__()
        self.t_born = time.monotonic()
        self.method, self.idle_watts = "total_energy_counter", 100.0
        self._nvml = object()

    def _counter_mj(self):
        ticks = int((time.monotonic() - self.t_born) / 0.02)
        return 5_000_000 + ticks * 3000  # 3 J per 20 ms tick = 150 W

    def power_watts(self):
        return 150.0


def test_energy_is_measured_between_counter_ticks():
    tl = Timeline()
    meter = FakeCounter()
    tl.use_meter(meter)
    assert tl.wait_for_meter(0)
    time.sleep(0.3)
    tl.mark("first_token")
    rec = tl.record()
    assert rec["energy_error"] is None, rec["energy_error"]
    window_s = rec["process_start_to_first_token_ms"] / 1000 - rec["energy_window_start_ms"] / 1000
    # 150 W over the window, within a couple of polling periods (the window starts at a tick)
    assert 0.2 < window_s < 0.31
    assert rec["joules_to_first_token"] == pytest.approx(150 * window_s, abs=0.8)
    assert rec["joules_above_idle_to_first_token"] == pytest.approx(50 * window_s, abs=0.8)
    assert 0 <= rec["energy_extrapolated_ms"] <= 25


def test_cli_summary_line_and_json_record_from_a_real_process(tmp_path):
    """A real `reflex generate` on the embedded model: the record is complete and consistent."""
    rec_path = tmp_path / "rec.json"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    r = subprocess.run([sys.executable, "-m", "reflex_runtime.cli", "generate", "The capital of France is",
                        "-n", "2", "--backend", "cpu", "--record", str(rec_path)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "process_start_to_first_token_ms=" in r.stderr and "joules_to_first_token=null" in r.stderr
    rec = json.loads(rec_path.read_text())
    cs = rec["coldstart"]
    assert RECORD_FIELDS <= set(cs)
    assert cs["python_started_ms"] > 0  # t0 precedes the first line of Python
    names = [s["stage"] for s in cs["stages"]]
    assert names.index("gguf_open") < names.index("tokenizer") < names.index("first_token")
    assert cs["energy_error"]  # the reason energy is null (CPU backend)
