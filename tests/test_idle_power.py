"""The idle power the record's net energy subtracts (reflex_runtime/measure/idle_power.py): the sources in
their order, the calibration `reflex doctor` caches per GPU, and the meter using it. NVML is a
fake here; scripts/bench_coldstart.py checks the net figure against an external reading on a GPU."""

from __future__ import annotations

import ctypes
import json
import time

import pytest

from reflex_runtime.measure import idle_power
from reflex_runtime.measure.energy import EnergyMeter


class FakeNvml:
    """The NVML calls idle_power.py makes, on a GPU drawing `watts` (mW in NVML's units)."""

    def __init__(self, watts=81.5, uuid="GPU-1234", busy=0, has_field=True, average=134.0):
        self.watts, self.uuid, self.busy, self.has_field, self.average = watts, uuid, busy, has_field, average

    def nvmlDeviceGetFieldValues(self, handle, count, ref):
        fv = ref._obj
        if not self.has_field:
            fv.nvmlReturn = 3  # NVML_ERROR_NOT_SUPPORTED
            return 0
        fv.nvmlReturn, fv.valueType = 0, 1
        fv.value.uiVal = int(self.watts * 1000)
        return 0

    def nvmlDeviceGetUUID(self, handle, buf, size):
        buf.value = self.uuid.encode()
        return 0

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle, count_ref, infos):
        count_ref._obj.value = self.busy
        return 7 if self.busy else 0

    def nvmlDeviceGetPowerUsage(self, handle, ref):
        ref._obj.value = int(self.average * 1000)
        return 0

    def nvmlDeviceGetTotalEnergyConsumption(self, handle, ref):
        ref._obj.value = 5_000_000
        return 0


def test_sources_in_order():
    assert idle_power.resolve("77", 80.0) == (77.0, "env REFLEX_IDLE_WATTS")
    assert idle_power.resolve(None, 80.0) == (80.0, "calibrated by reflex doctor")
    assert idle_power.resolve("nonsense", 80.0) == (80.0, "calibrated by reflex doctor")
    assert idle_power.resolve("-5", None) == (None, None)
    assert idle_power.resolve("", None) == (None, None)


def test_instant_power_is_read_from_the_field_and_absent_when_unsupported():
    assert idle_power.instant_watts(FakeNvml(81.5), None) == pytest.approx(81.5)
    assert idle_power.instant_watts(FakeNvml(has_field=False), None) is None


def test_calibration_is_cached_per_gpu_and_refused_on_a_busy_gpu(tmp_path):
    path = str(tmp_path / "idle_power.json")
    out = idle_power.calibrate(FakeNvml(79.25, "GPU-a"), None, seconds=0.12, every=0.02, path=path)
    assert out["idle_watts"] == pytest.approx(79.25) and out["samples"] >= 3 and out["cached_in"] == path
    idle_power.calibrate(FakeNvml(95.0, "GPU-b"), None, seconds=0.05, every=0.02, path=path)
    assert idle_power.calibrated_watts("GPU-a", path) == pytest.approx(79.25)
    assert idle_power.calibrated_watts("GPU-b", path) == pytest.approx(95.0)
    assert idle_power.calibrated_watts("GPU-other", path) is None
    once = idle_power.calibrate(FakeNvml(81.0, "GPU-c"), None, seconds=0.0, every=0.0, path=path)
    assert once["samples"] >= 1 and once["idle_watts"] == pytest.approx(81.0)  # never a median of nothing
    busy = idle_power.calibrate(FakeNvml(200.0, "GPU-a", busy=2), None, seconds=0.05, path=path)
    assert busy["idle_watts"] is None and "2 process(es)" in busy["error"]
    assert idle_power.calibrated_watts("GPU-a", path) == pytest.approx(79.25)  # unchanged
    (tmp_path / "idle_power.json").write_text("{not json")
    assert idle_power.calibrated_watts("GPU-a", path) is None


def _meter(nvml) -> EnergyMeter:
    m = EnergyMeter()
    m._nvml, m._handle = nvml, ctypes.c_void_p()
    m._ready(time.monotonic)
    m.resolve_idle()
    return m


def test_the_meter_subtracts_a_real_idle_reading_or_none(tmp_path, monkeypatch):
    monkeypatch.setenv("REFLEX_CACHE", str(tmp_path))
    monkeypatch.delenv(idle_power.ENV, raising=False)
    # what NVML reads when it comes up in a cold start: the process has already woken the GPU
    nvml = FakeNvml(watts=120.0, uuid="GPU-x", average=134.0)
    m = _meter(nvml)
    assert (m.idle_watts, m.idle_source) == (None, None)
    assert m.start_watts == 134.0 and m.method == "total_energy_counter"
    json.dump({"GPU-x": {"idle_watts": 80.5}}, open(tmp_path / "idle_power.json", "w"))
    m = _meter(nvml)
    assert (m.idle_watts, m.idle_source) == (80.5, "calibrated by reflex doctor")
    monkeypatch.setenv(idle_power.ENV, "78")
    assert _meter(nvml).idle_watts == 78.0


def test_the_record_says_why_there_is_no_net_figure(monkeypatch, tmp_path):
    """No idle reading: gross joules as before, net null with the reason."""
    from test_coldstart import FakeMeter

    from reflex_runtime.measure import coldstart

    class NoIdle(FakeMeter):
        def start(self, clock, flags=0):
            super().start(clock, flags)
            self.idle_watts = self.idle_source = None

        def resolve_idle(self):  # neither REFLEX_IDLE_WATTS nor a calibration
            pass

    born = time.monotonic()
    monkeypatch.setattr("reflex_runtime.measure.coldstart.EnergyMeter", lambda index=0: NoIdle(born))
    tl = coldstart.Timeline()
    tl.t0 = coldstart.now_boottime()
    tl.start_energy()
    time.sleep(0.15)
    tl.mark("first_token")
    rec = tl.record()
    assert rec["joules_process_start_to_first_token"] > 0 and rec["energy_error"] is None
    assert rec["joules_above_idle_process_start_to_first_token"] is None
    assert "reflex doctor" in rec["energy_net_error"] and "REFLEX_IDLE_WATTS" in rec["energy_net_error"]
