#!/usr/bin/env python3
"""Cold-start benchmark: N fresh processes per case, spawn -> first token and spawn -> exit,
with GPU energy over the same windows, gross and net of idle.

    python scripts/bench_coldstart.py --model Q8.gguf --model Q4KM.gguf --runs 10 \
        --peer "transformers=python scripts/peer_transformers.py HF_DIR" --out results/DIR

For every case it measures idle power just before (after the GPU has settled), then spawns the
child N times. The first token is the first byte the child writes to stdout (reflex streams the
generated text there; system1 prints its result there), read as it arrives.
Energy: NVML's total-energy counter only moves every ~100 ms (12 J steps at idle on an H200), so
each run is spawned right after a tick and the energy at the first output and at exit is read
at the next tick, less the run's average power times the time since the event (EnergyClock).
net = gross - idle watts x window. A cold start is mostly the GPU idling, so the net figure is
the one that shows the work; the method is checked on `sleep 1`, which must net ~0 J.
Page cache "cold" drops the model file's pages (posix_fadvise DONTNEED, or drop_caches when
writable) before each run. Writes results.json and a waterfall PNG of the child's stages.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time

PROMPT = "The capital of France is"


class Nvml:
    def __init__(self, index: int = 0):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        assert self.lib.nvmlInit_v2() == 0, "nvmlInit failed"
        self.h = ctypes.c_void_p()
        assert self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.h)) == 0
        name = ctypes.create_string_buffer(96)
        self.lib.nvmlDeviceGetName(self.h, name, 96)
        self.name = name.value.decode()

    def energy_mj(self) -> int:
        v = ctypes.c_ulonglong()
        assert self.lib.nvmlDeviceGetTotalEnergyConsumption(self.h, ctypes.byref(v)) == 0
        return v.value

    def power_w(self) -> float:
        v = ctypes.c_uint()
        self.lib.nvmlDeviceGetPowerUsage(self.h, ctypes.byref(v))
        return v.value / 1000


class EnergyClock:
    """Windows of the NVML energy counter, timed at its ticks.

    The counter moves every ~100 ms, so a window is aligned to it: the child is spawned right
    after a tick (E0 known at t0), and for an instant t inside the run we wait for the first tick
    after t and step back by the run's average power: E(t) = E_a - P (t_a - t). We never poll
    while a child initialises CUDA: polling NVML during cuInit slowed it several-fold on the H200."""

    def __init__(self, nv: Nvml):
        self.nv = nv

    def wait_tick(self, max_s: float = 0.35) -> tuple[float, int] | None:
        last = self.nv.energy_mj()
        end = time.perf_counter() + max_s
        while time.perf_counter() < end:
            time.sleep(0.001)
            v = self.nv.energy_mj()
            if v != last:
                return time.perf_counter(), v
        return None

    @staticmethod
    def at(t: float, start: tuple[float, int], after: tuple[float, int] | None) -> float | None:
        if after is None or after[0] <= start[0]:
            return None
        watts_mj = (after[1] - start[1]) / (after[0] - start[0])
        return after[1] - watts_mj * (after[0] - t)


def counter_resolution(nv: Nvml, seconds: float = 1.0) -> dict:
    """How often the energy counter moves and by how much (it is not continuous)."""
    t_end = time.perf_counter() + seconds
    last, t_last, steps, gaps = nv.energy_mj(), time.perf_counter(), [], []
    while time.perf_counter() < t_end:
        v = nv.energy_mj()
        if v != last:
            now = time.perf_counter()
            steps.append(v - last)
            gaps.append(now - t_last)
            last, t_last = v, now
    return {"updates_per_s": len(steps) / seconds, "median_update_ms": round(statistics.median(gaps) * 1000, 3) if gaps else None,
            "median_step_mj": statistics.median(steps) if steps else None, "unit": "mJ"}


def idle_watts(clock: EnergyClock, seconds: float, settle_s: float = 1.0) -> float | None:
    """Average power between two counter ticks `seconds` apart, after the GPU settles."""
    time.sleep(settle_s)
    a = clock.wait_tick()
    time.sleep(seconds)
    b = clock.wait_tick()
    if a is None or b is None:
        return None
    return (b[1] - a[1]) / 1000 / (b[0] - a[0])


def drop_page_cache(path: str | None) -> str:
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            os.sync()
            f.write("3\n")
        return "drop_caches"
    except OSError:
        pass
    if path:
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        return "fadvise_dontneed(model file)"
    return "none"


def warm_page_cache(path: str | None) -> None:
    if path:
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass


def run_once(cmd: list[str], clock: EnergyClock | None, env: dict) -> dict:
    start = clock.wait_tick() if clock else None  # spawn on a counter tick: E(t0) is known
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    first = None
    after_first: list = []
    out = bytearray()
    fd = proc.stdout.fileno()
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        if first is None and chunk.strip():
            first = time.perf_counter()
            if clock:
                threading.Thread(target=lambda: after_first.append(clock.wait_tick()), daemon=True).start()
        out += chunk
    err = proc.stderr.read()
    proc.wait()
    t_exit = time.perf_counter()
    row = {"rc": proc.returncode, "spawn_to_first_output_s": (first - t0) if first else None,
           "spawn_to_exit_s": t_exit - t0, "stdout_head": out[:80].decode(errors="replace"),
           "stderr_tail": err[-300:].decode(errors="replace")}
    if clock and start is not None:
        after_exit = clock.wait_tick()
        deadline = time.perf_counter() + 0.5
        while first and not after_first and time.perf_counter() < deadline:
            time.sleep(0.002)
        e0 = start[1] + 0.0
        e_first = clock.at(first, start, after_first[0]) if first and after_first else None
        e_exit = clock.at(t_exit, start, after_exit)
        row["joules_to_first_output"] = (e_first - e0) / 1000 if e_first is not None else None
        row["joules_to_exit"] = (e_exit - e0) / 1000 if e_exit is not None else None
    return row


def pct(values, q):
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    k = (len(v) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def _measured_row(cmd, clock, env, idle, record_path) -> dict:
    row = run_once(cmd, clock, env)
    if record_path and os.path.exists(record_path):
        with open(record_path) as f:
            row["child_record"] = json.load(f)
        os.unlink(record_path)
    if idle is not None:
        if row.get("joules_to_first_output") is not None:
            row["net_joules_to_first_output"] = row["joules_to_first_output"] - idle * row["spawn_to_first_output_s"]
        if row.get("joules_to_exit") is not None:
            row["net_joules_to_exit"] = row["joules_to_exit"] - idle * row["spawn_to_exit_s"]
    return row


def run_case(name: str, cmd: list[str], runs: int, clock: EnergyClock | None, model: str | None, cache: str,
             idle_s: float, record_path: str | None) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    idle = idle_watts(clock, idle_s) if clock else None
    rows, method = [], None
    subprocess.run(cmd, capture_output=True, env=env)  # one untimed run: imports and files into page cache
    for _ in range(runs):
        if cache == "cold":
            method = drop_page_cache(model)
        else:
            warm_page_cache(model)
        rows.append(_measured_row(cmd, clock, env, idle, record_path))
    return _summarize(name, cmd, rows, cache, method, idle, clock)


def run_paired(cases: list[tuple[str, list[str]]], runs: int, clock: EnergyClock | None, model: str, idle_s: float,
               record_path: str | None) -> tuple[list[dict], dict]:
    """Two commands run alternately (A B B A A B ...), page cache warm: whatever drifts on the machine
    during the benchmark then affects both alike, so the per-pair difference of their first-output
    times compares them more fairly than two cases run one after the other."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    idle = idle_watts(clock, idle_s) if clock else None
    for _, cmd in cases:
        subprocess.run(cmd, capture_output=True, env=env)
    rows: dict[str, list] = {name: [] for name, _ in cases}
    for r in range(runs):
        for name, cmd in cases if r % 2 == 0 else cases[::-1]:  # A B, B A, ...: neither always goes first
            warm_page_cache(model)
            rows[name].append(_measured_row(cmd, clock, env, idle, record_path))
    (a, _), (b, _) = cases
    diffs = [(y["spawn_to_first_output_s"] - x["spawn_to_first_output_s"]) * 1000 for x, y in zip(rows[a], rows[b])
             if x["rc"] == 0 and y["rc"] == 0 and x["spawn_to_first_output_s"] and y["spawn_to_first_output_s"]]
    pair = {"first": a, "second": b, "pairs": len(diffs),
            "second_minus_first_ms": {"p50": pct(diffs, 0.5), "mean": statistics.mean(diffs) if diffs else None,
                                      "p05": pct(diffs, 0.05), "p95": pct(diffs, 0.95)}}
    return [_summarize(f"{name} (paired)", cmd, rows[name], "warm", None, idle, clock) for name, cmd in cases], pair


def _summarize(name, cmd, rows, cache, method, idle, clock) -> dict:
    ok = [r for r in rows if r["rc"] == 0]

    def stat(key):
        vals = [r.get(key) for r in ok]
        return {"p50": pct(vals, 0.5), "p95": pct(vals, 0.95), "min": pct(vals, 0.0)}

    summary = {"case": name, "cmd": " ".join(shlex.quote(c) for c in cmd), "page_cache": cache, "cache_drop_method": method,
               "runs": len(rows), "failures": len(rows) - len(ok), "idle_watts": idle,
               "spawn_to_first_output_s": stat("spawn_to_first_output_s"), "spawn_to_exit_s": stat("spawn_to_exit_s")}
    if clock:
        for k in ("joules_to_first_output", "net_joules_to_first_output", "joules_to_exit", "net_joules_to_exit"):
            summary[k] = stat(k)
    stages = _median_stages([r["child_record"] for r in ok if "child_record" in r])
    if stages:
        summary["child_stages_ms"] = stages
    summary["rows"] = rows
    return summary


def _median_stages(records: list[dict]) -> dict | None:
    if not records:
        return None
    out: dict = {}
    cs = [r.get("coldstart") or {} for r in records]
    names = [s["stage"] for s in cs[0].get("stages", [])]
    for n in names:
        out[n] = statistics.median(next(s["at_ms"] for s in c["stages"] if s["stage"] == n) for c in cs
                                   if any(s["stage"] == n for s in c.get("stages", [])))
    spans = {}
    for k in cs[0].get("background", {}):
        spans[k] = [statistics.median(c["background"][k]["start_ms"] for c in cs if k in c.get("background", {})),
                    statistics.median(c["background"][k]["end_ms"] for c in cs if k in c.get("background", {}))]
    return {"marks_at_ms": out, "background_ms": spans,
            "process_start_to_first_token_ms": statistics.median(c["process_start_to_first_token_ms"] for c in cs
                                                                  if c.get("process_start_to_first_token_ms")),
            "joules_to_first_token": _median_or_none([c.get("joules_to_first_token") for c in cs]),
            "joules_above_idle_to_first_token": _median_or_none([c.get("joules_above_idle_to_first_token") for c in cs])}


def _median_or_none(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def waterfall(cases: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [c for c in cases if c.get("child_stages_ms")]
    if not cases:
        return
    fig, axes = plt.subplots(len(cases), 1, figsize=(11, 2.2 + 0.5 * 12), squeeze=False)
    for ax, c in zip(axes[:, 0], cases):
        st = c["child_stages_ms"]
        marks = sorted(st["marks_at_ms"].items(), key=lambda kv: kv[1])
        y, prev, labels = 0, 0.0, []
        for name, at in marks:
            ax.barh(y, at - prev, left=prev, color="tab:blue")
            labels.append(f"{name} ({at - prev:.0f} ms)")
            prev, y = at, y + 1
        for name, (a, b) in sorted(st["background_ms"].items(), key=lambda kv: kv[1][0]):
            ax.barh(y, b - a, left=a, color="tab:orange")
            labels.append(f"[thread] {name} ({b - a:.0f} ms)")
            y += 1
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("ms since process start")
        ax.set_title(f"{c['case']}: first token p50 {c['spawn_to_first_output_s']['p50'] * 1000:.0f} ms from spawn "
                     f"({c['page_cache']} page cache)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", default=[], help="GGUF file (repeatable)")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--cache", default="warm,cold", help="page-cache states to run: warm, cold")
    ap.add_argument("--system1", action="store_true", help="also time `reflex system1` with 3 candidates")
    ap.add_argument("--paired", action="store_true",
                    help="with --system1: run generate and system1 alternately for the warm-cache case and report "
                         "the per-pair difference of their first-output times")
    ap.add_argument("--peer", action="append", default=[], metavar="NAME=CMD", help="another command to time the same way")
    ap.add_argument("--peer-runs", type=int, default=None, help="runs per peer (default: --runs)")
    ap.add_argument("--idle-s", type=float, default=2.0)
    ap.add_argument("--out", required=True, help="output folder")
    args = ap.parse_args()
    if args.paired and not args.system1:
        ap.error("--paired compares generate with system1: give --system1 too")
    os.makedirs(args.out, exist_ok=True)
    try:
        nv = Nvml()
    except (OSError, AssertionError) as e:
        print(f"no NVML ({e}); timing only", file=sys.stderr)
        nv = None
    result = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "gpu": nv.name if nv else None,
              "prompt": args.prompt, "python": sys.version.split()[0], "cases": []}
    trace = EnergyClock(nv) if nv else None
    if nv:
        result["energy_counter"] = counter_resolution(nv)
        check = run_case("sleep 1 (method check: net must be ~0 J)", ["sleep", "1"], 3, trace, None, "warm", args.idle_s,
                         None)
        result["method_check_sleep_1"] = {k: check[k] for k in ("idle_watts", "joules_to_exit", "net_joules_to_exit")}
    rec = os.path.join(tempfile.mkdtemp(), "record.json")
    base = [sys.executable, "-m", "reflex_runtime.cli"]
    for model in args.model:
        tag = os.path.basename(model)
        cases = [("generate", base + ["generate", args.prompt, "-n", "1", "--backend", "cuda", "--model", model, "--record", rec])]
        if args.system1:
            cases.append(("system1", base + ["system1", args.prompt, "-c", " Paris", "-c", " London", "-c", " Berlin",
                                             "--backend", "cuda", "--model", model, "--record", rec]))
        paired = args.paired and len(cases) == 2 and "warm" in args.cache.split(",")
        for what, cmd in cases:
            for cache in args.cache.split(","):
                if cache == "warm" and paired:
                    continue  # measured below, alternating with the other command
                c = run_case(f"reflex {what} {tag}", cmd, args.runs, trace, model, cache, args.idle_s, rec)
                result["cases"].append(c)
                _print_case(c)
        if paired:
            pcases, pair = run_paired([(f"reflex {w} {tag}", cmd) for w, cmd in cases], args.runs, trace, model,
                                      args.idle_s, rec)
            result["cases"] += pcases
            result.setdefault("paired", []).append(pair)
            for c in pcases:
                _print_case(c)
            d = pair["second_minus_first_ms"]
            if pair["pairs"]:
                print(f"    paired, {pair['pairs']} pairs: system1 - generate first output p50 {d['p50']:+.1f} ms, "
                      f"mean {d['mean']:+.1f} ms (p05 {d['p05']:+.1f}, p95 {d['p95']:+.1f})", flush=True)
            else:
                print("    paired: no pair where both runs succeeded", flush=True)
    for peer in args.peer:
        name, _, cmd = peer.partition("=")
        c = run_case(name, shlex.split(cmd), args.peer_runs or args.runs, trace, None, "warm", args.idle_s, None)
        result["cases"].append(c)
        _print_case(c)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
    waterfall(result["cases"], os.path.join(args.out, "waterfall.png"))
    return 0


def _print_case(c: dict) -> None:
    f, x = c["spawn_to_first_output_s"], c["spawn_to_exit_s"]
    line = (f"{c['case']:<48} {c['page_cache']:<4} first p50 {_ms(f['p50'])} p95 {_ms(f['p95'])}  exit p50 {_ms(x['p50'])}"
            f"  fails {c['failures']}")
    if "joules_to_first_output" in c:
        line += (f"  J first {_j(c['joules_to_first_output']['p50'])} (net {_j(c['net_joules_to_first_output']['p50'])})"
                 f"  J exit {_j(c['joules_to_exit']['p50'])} (net {_j(c['net_joules_to_exit']['p50'])})")
    print(line, flush=True)
    st = c.get("child_stages_ms")
    if st:
        marks = " ".join(f"{k}@{v:.0f}" for k, v in sorted(st["marks_at_ms"].items(), key=lambda kv: kv[1]))
        spans = " ".join(f"{k}[{a:.0f}-{b:.0f}]" for k, (a, b) in sorted(st["background_ms"].items(), key=lambda kv: kv[1][0]))
        print(f"    child marks (ms from process start): {marks}", flush=True)
        print(f"    child threads: {spans}", flush=True)
        print(f"    child first token {st['process_start_to_first_token_ms']:.1f} ms, {st['joules_to_first_token']} J "
              f"({st['joules_above_idle_to_first_token']} J above idle)", flush=True)


def _ms(v):
    return f"{v * 1000:7.1f} ms" if v is not None else "   n/a"


def _j(v):
    return f"{v:6.1f}" if v is not None else "n/a"


if __name__ == "__main__":
    sys.exit(main())
