"""The cold-start timeline and its energy fields (no GPU needed)."""

import json
import os
import subprocess
import sys
import time

import pytest

from reflex_runtime.measure import coldstart, energy
from reflex_runtime.measure.coldstart import Timeline
from reflex_runtime.measure.energy import EnergyMeter, window_energy

RECORD_FIELDS = {
    "t0_source", "t0_resolution_ms", "python_started_ms", "stages", "total_ms", "background",
    "process_start_to_first_token_ms", "model_page_cache_resident", "joules_process_start_to_first_token",
    "joules_above_idle_process_start_to_first_token", "energy_measured_joules", "energy_measured_from_ms",
    "energy_estimated_joules", "energy_estimated_span_ms", "energy_estimated_watts", "energy_estimated_from",
    "energy_counter_period_ms", "energy_method", "energy_nvml_start", "idle_watts",
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


class Counter:
    """A counter like NVML's: steps every 100 ms (first at `phase`), holding the energy of the
    power profile `watts(t0, t1) -> J` up to its last step."""

    def __init__(self, watts, phase=0.037, period=0.1, mj0=5_000_000):
        self.watts, self.phase, self.period, self.mj0 = watts, phase, period, mj0

    def last_step(self, t):
        k = (t - self.phase) // self.period
        return self.phase + k * self.period

    def value(self, t):
        s = self.last_step(t)
        return self.mj0 + round(1000 * self.watts(0.0, max(s, 0.0))) if s >= 0 else self.mj0

    def reads(self, t_n, t_end, poll=0.005):
        """What EnergyMeter records: the read at NVML start, the read at the end mark, the step after."""
        step = self.last_step(t_end) + self.period
        return (t_n, self.value(t_n)), [(t_end, self.value(t_end)), (step + poll / 2, self.value(step + 1e-9))]


def test_constant_power_is_recovered_from_process_start():
    """150 W from t = 0 and 150 W idle: whatever the counter's phase and however late NVML comes
    up, the measured part plus the estimated part equal 150 W x the window."""
    for t_n, phase, t_end in ((0.12, 0.037, 0.48), (0.40, 0.091, 0.45), (0.05, 0.002, 1.3), (0.31, 0.055, 0.33)):
        c = Counter(lambda a, b: 150 * (b - a), phase)
        start, end = c.reads(t_n, t_end)
        e = window_energy(start, end, 150.0, idle_watts=150.0)
        assert e["error"] is None
        assert e["joules"] == pytest.approx(150 * t_end, abs=0.6), (t_n, phase, e)
        assert e["joules_above_idle"] == pytest.approx(0, abs=0.6)
        # the measured window starts at the counter step before NVML's first read
        assert e["measured_from_ms"] / 1000 == pytest.approx(max(c.last_step(t_n), 0), abs=0.004)
        assert e["estimated_span_ms"] == e["measured_from_ms"]


def test_the_span_before_nvml_is_estimated_at_idle_power_and_labelled():
    """80 W until 0.35 s, then 300 W; NVML reads at 0.30 s: everything after the step before that
    read is measured; the 0.237 s before it is estimated at the idle power NVML reports."""
    def watts(a, b):
        lo, hi = min(b, 0.35), max(a, 0.35)
        return 80 * max(0.0, lo - a) + 300 * max(0.0, b - hi)

    c = Counter(watts, phase=0.037)
    start, end = c.reads(0.30, 0.61)
    e = window_energy(start, end, 80.0)
    assert e["estimated_span_ms"] == pytest.approx(237, abs=3) and e["estimated_from"] == "power at NVML start"
    assert e["estimated_joules"] == pytest.approx(80 * 0.237, abs=0.3)
    assert e["measured_joules"] == pytest.approx(watts(0.237, 0.61), abs=1.0)
    assert e["joules"] == pytest.approx(watts(0.0, 0.61), abs=1.0)


def test_net_energy_subtracts_the_idle_power_given_not_the_power_at_nvml_start():
    """130 W throughout, NVML reporting 130 W when it comes up, an idle of 80 W: the gross figure is
    130 W x the window and the net one 50 W x the window (idle_power.py says where 80 W comes from)."""
    c = Counter(lambda a, b: 130 * (b - a), phase=0.021)
    start, end = c.reads(0.15, 0.52)
    e = window_energy(start, end, 130.0, idle_watts=80.0)
    assert e["joules"] == pytest.approx(130 * 0.52, abs=0.6)
    assert e["joules_above_idle"] == pytest.approx(50 * 0.52, abs=0.6)


def test_missing_or_misordered_reads_are_an_error_not_a_number():
    c = Counter(lambda a, b: 100 * (b - a))
    start, end = c.reads(0.1, 0.5)
    assert "did not step" in window_energy(start, end[:1], 100.0)["error"]
    assert "was not read" in window_energy(None, end, 100.0)["error"]
    late = [end[0], (end[1][0] + 0.2, end[1][1] + 20_000)]  # the waiting thread missed a step
    assert "out of order" in window_energy(start, late, 100.0)["error"]


def test_a_step_between_the_mark_and_its_read_is_extrapolated_back_not_lost():
    """The read of V_e returns 10 ms after the mark (a slow driver call, the GIL) and the counter
    stepped 8 ms after the mark: V_e already holds that step, and the step the poll sees comes a
    period later. 6 records of 60 on an H200 (s34) lost their figure to reads like these; the energy
    up to the mark is V_e less the power over those 8 ms."""
    c = Counter(lambda a, b: 200 * (b - a), phase=0.037)
    t_end = 0.429  # the counter steps at 0.437
    t_read = t_end + 0.010
    nxt = c.last_step(t_read) + c.period
    start = (0.2, c.value(0.2))
    end = [(t_end, c.value(t_read)), (nxt + 0.001, c.value(nxt + 1e-9))]
    assert "out of order" in window_energy(start, end, 200.0)["error"]  # what the record said before
    e = window_energy(start, end, 200.0, end_read_at=t_read, last_unstepped_at=nxt - 0.002)
    assert e["error"] is None
    assert e["joules"] == pytest.approx(200 * t_end, abs=0.3)


def test_a_late_poll_dates_the_step_from_the_reads_around_it():
    """The thread waiting for the step was held 30 ms (the GIL, a slow driver call): the step lies
    between the last read that returned V_e and the first that did not, not one poll before."""
    c = Counter(lambda a, b: 120 * (b - a), phase=0.011)
    t_end = 0.52
    nxt = c.last_step(t_end) + c.period
    start = (0.15, c.value(0.15))
    end = [(t_end, c.value(t_end)), (nxt + 0.028, c.value(nxt + 1e-9))]
    e = window_energy(start, end, 120.0, end_read_at=t_end + 1e-4, last_unstepped_at=nxt - 0.002)
    assert e["error"] is None
    assert e["joules"] == pytest.approx(120 * t_end, abs=2.0)
    assert e["measured_from_ms"] / 1000 == pytest.approx(c.last_step(0.15), abs=0.016)
    # a poll held past a whole period may have missed a step: no number
    starved = [end[0], (nxt + 0.15, c.value(nxt + 0.15))]
    assert "out of order" in window_energy(start, starved, 120.0, end_read_at=t_end,
                                           last_unstepped_at=nxt - 0.05)["error"]


class FakeMeter(EnergyMeter):
    """EnergyMeter over a fake counter stepping every 100 ms at a constant 150 W since `born`."""

    def __init__(self, born):
        super().__init__()
        self.born = born

    def start(self, clock, flags=0):
        self._nvml = object()
        self.start_watts = self.idle_watts = 150.0
        self.idle_source = "fake"
        self.method = "total_energy_counter"
        self.start_read = (clock(), self.counter_mj())

    def counter_mj(self):
        return 5_000_000 + int((time.monotonic() - self.born) / 0.1) * 15_000  # 15 J per 100 ms = 150 W

    def power_watts(self):
        return 150.0


def test_timeline_record_covers_process_start_to_first_token(monkeypatch):
    """End to end through the Timeline and the thread that waits for the step after the first
    token, with NVML coming up 0.25 s after process start."""
    tl = Timeline()
    tl.t0 = coldstart.now_boottime()  # a process that starts now
    born = time.monotonic()  # ... with a counter at 150 W since then
    monkeypatch.setattr("reflex_runtime.measure.coldstart.EnergyMeter", lambda index=0: FakeMeter(born))
    time.sleep(0.25)
    tl.start_energy()
    assert tl.wait_for_meter(0)
    time.sleep(0.3)
    tl.mark("first_token")
    rec = tl.record()
    assert rec["energy_error"] is None, rec["energy_error"]
    t_first = rec["process_start_to_first_token_ms"] / 1000
    # 2 J: the polls that date the counter's steps, on a loaded machine
    assert rec["joules_process_start_to_first_token"] == pytest.approx(150 * t_first, abs=2.0)
    assert rec["joules_above_idle_process_start_to_first_token"] == pytest.approx(0, abs=2.0)
    assert 150 <= rec["energy_estimated_span_ms"] <= 260  # NVML was not up for the first 250 ms
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


def test_the_gpu_cold_path_never_imports_numpy():
    """numpy's import (~60-300 ms, longer beside the threads cuInit and NVML keep busy) is not on
    the way to the first token: every module the CUDA load and a generate import goes without it
    (a module that needs it for the CPU backend, checks or benchmarks imports it in a function).
    The paged cache's table once imported it in gpu/model.py: spawn -> first token +350 ms."""
    import subprocess
    import sys

    mods = ["reflex_runtime.cli", "reflex_runtime.loader", "reflex_runtime.engine", "reflex_runtime.gpu.bootstrap",
            "reflex_runtime.gpu.runner", "reflex_runtime.gpu.upload", "reflex_runtime.gpu.score",
            "reflex_runtime.text.tokenizer", "reflex_runtime.text.chat", "reflex_runtime.modelfile.gguf_file",
            "reflex_runtime.modelfile.modelcache", "reflex_runtime.measure.coldstart", "reflex_runtime.measure.energy",
            "reflex_runtime.families"]
    mods += [f"reflex_runtime.families.{f}.gpu" for f in ("qwen3", "qwen3moe", "qwen35", "deepseek2", "gemma3", "llama")]
    code = "import importlib, sys\n" + "".join(f"importlib.import_module({m!r})\n" for m in mods) + \
        "print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


def test_parsing_the_command_line_imports_no_engine():
    """Every command builds the whole parser before its work starts; the serving options' ranges
    once imported engine.py there (and with it dataclasses and inspect: ~20 ms) ahead of the
    model file's open on every cold start. The ranges are looked up when a value is parsed."""
    import subprocess
    import sys

    code = ("import sys\nfrom reflex_runtime import cli\n"
            "a = cli.build_parser().parse_args(['generate', 'hi', '--model', 'm.gguf'])\n"
            "print('reflex_runtime.engine' in sys.modules)\n"
            "cli.build_parser().parse_args(['serve', '--model', 'm.gguf', '--parallel', '8', '--ctx', '64'])\n"
            "print('reflex_runtime.engine' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "True"]  # looked up once a value is parsed
