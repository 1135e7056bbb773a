#!/usr/bin/env python3
"""Cold-start benchmark: N fresh processes per case, spawn -> first token and spawn -> exit,
with GPU energy over the same windows, gross and net of idle, read by this process from NVML,
beside what each child's own record says it spent (process start -> first token).

    python scripts/bench_coldstart.py --model Q8.gguf --model Q4KM.gguf --runs 10 \
        --llama-simple /tmp/peers/llama.cpp/llama-simple --system1 \
        --variant "nvml_after_context:REFLEX_NVML_START=after_context" --out results/DIR

With a warm page cache every case of a model (reflex generate [per --variant], reflex system1,
llama-simple) runs interleaved round-robin, one run each per round, the order rotating each
round, so drift on the machine hits every case alike; per-round differences against the first
case are reported. `--prompt-tokens N` makes the prompt about N tokens long (a cold start with
a long prompt); llama-simple gets the same text.

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
        self.step_j: float | None = None  # the counter's median step at idle (set from counter_resolution)

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


def disk_read_rate(path: str, nbytes: int = 4 << 30, threads: int = 8, chunk: int = 8 << 20) -> dict:
    """The disk's read rate under the model file, page cache dropped first: its first nbytes read
    on `threads` threads, as the cold path's read-ahead reads (modelfile/pagecache.prefetch)."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's package
    from reflex_runtime.modelfile.pagecache import prefetch

    method = drop_page_cache(path)
    n = min(nbytes, os.path.getsize(path))
    t0 = time.perf_counter()
    for t in prefetch(path, threads=threads, chunk=chunk, ranges=[(0, n)]):
        t.join()
    dt = time.perf_counter() - t0
    return {"bytes": n, "threads": threads, "seconds": round(dt, 3), "gb_s": round(n / dt / 1e9, 2),
            "cache_drop_method": method}


def warm_page_cache(path: str | None) -> None:
    if path:
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass


CHILD_TIMEOUT_S = 90  # a child still running after this is killed and counted as a failure


def run_once(cmd: list[str], clock: EnergyClock | None, env: dict) -> dict:
    start = clock.wait_tick() if clock else None  # spawn on a counter tick: E(t0) is known
    # stderr to a file, not a pipe: llama.cpp writes more than a pipe holds (64 KB) to stderr while
    # we read stdout, and a child blocked on a full stderr pipe never finishes (every llama-simple
    # run of the 2026-12-01 GPU run hung here until the watchdog)
    err_file = tempfile.TemporaryFile()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err_file, env=env)
    watchdog = threading.Timer(CHILD_TIMEOUT_S, proc.kill)
    watchdog.start()
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
    proc.wait()
    t_exit = time.perf_counter()
    watchdog.cancel()
    err_file.seek(0)
    err = err_file.read()
    err_file.close()
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
    cs = (row.get("child_record") or {}).get("coldstart") or {}
    row["child_joules_process_start_to_first_token"] = cs.get("joules_process_start_to_first_token")
    row["child_net_joules"] = cs.get("joules_above_idle_process_start_to_first_token")
    row["child_idle_watts"], row["child_idle_source"] = cs.get("idle_watts"), cs.get("idle_watts_source")
    row["child_energy_estimated_joules"] = cs.get("energy_estimated_joules")
    return row


class Case:
    """One command to time: its argv, extra environment, and where its child writes a record."""

    def __init__(self, name: str, cmd: list[str], env: dict | None = None, record_path: str | None = None):
        self.name, self.cmd, self.record_path = name, cmd, record_path
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))


def run_case(case: Case, runs: int, clock: EnergyClock | None, model: str | None, cache: str, idle_s: float) -> dict:
    idle = idle_watts(clock, idle_s) if clock else None
    rows, method = [], None
    _untimed(case)  # imports and files into the page cache
    for _ in range(runs):
        if cache == "cold":
            method = drop_page_cache(model)
        else:
            warm_page_cache(model)
        rows.append(_measured_row(case.cmd, clock, case.env, idle, case.record_path))
        _progress(case.name, rows[-1])
    return _summarize(case, rows, cache, method, idle, clock)


def _untimed(case: Case) -> None:
    try:
        r = subprocess.run(case.cmd, capture_output=True, env=case.env, timeout=CHILD_TIMEOUT_S)
        print(f"  untimed run {case.name}: rc {r.returncode}", flush=True)
    except subprocess.TimeoutExpired:
        print(f"  untimed run {case.name}: killed after {CHILD_TIMEOUT_S} s", flush=True)


def _progress(name: str, row: dict) -> None:
    """One line per run as it ends (a long benchmark cut short still shows what it measured)."""
    f, j = row.get("spawn_to_first_output_s"), row.get("joules_to_first_output")
    rec = row.get("child_joules_process_start_to_first_token")
    print(f"  run {name}: rc {row['rc']} first {_ms(f)} exit {_ms(row['spawn_to_exit_s'])} J {_j(j)} record J {_j(rec)}"
          + ("" if row["rc"] == 0 else f" stderr: {row['stderr_tail'][-160:]!r}"), flush=True)


def run_interleaved(cases: list[Case], runs: int, clock: EnergyClock | None, model: str | None,
                    idle_s: float) -> tuple[list[dict], dict]:
    """Every case once per round, the starting case rotating each round (A B C, B C A, C A B...):
    whatever drifts on the machine during the benchmark affects every case alike, so per-round
    differences of first-output times compare them more fairly than cases run one after another."""
    idle = idle_watts(clock, idle_s) if clock else None
    for c in cases:
        _untimed(c)
    rows: dict[str, list] = {c.name: [] for c in cases}
    for r in range(runs):
        k = r % len(cases)
        for c in cases[k:] + cases[:k]:
            warm_page_cache(model)
            rows[c.name].append(_measured_row(c.cmd, clock, c.env, idle, c.record_path))
            _progress(c.name, rows[c.name][-1])
    first = cases[0].name
    diffs = {}
    for c in cases[1:]:
        d = [(y["spawn_to_first_output_s"] - x["spawn_to_first_output_s"]) * 1000 for x, y in zip(rows[first], rows[c.name])
             if x["rc"] == 0 and y["rc"] == 0 and x["spawn_to_first_output_s"] and y["spawn_to_first_output_s"]]
        diffs[c.name] = {"rounds": len(d), "p50": pct(d, 0.5), "mean": statistics.mean(d) if d else None,
                         "p05": pct(d, 0.05), "p95": pct(d, 0.95)}
    return ([_summarize(c, rows[c.name], "warm", None, idle, clock) for c in cases],
            {"reference_case": first, "minus_reference_first_output_ms": diffs})


def _summarize(case: Case, rows, cache, method, idle, clock) -> dict:
    ok = [r for r in rows if r["rc"] == 0]

    def stat(key):
        vals = [r.get(key) for r in ok]
        return {"p50": pct(vals, 0.5), "p90": pct(vals, 0.9), "p95": pct(vals, 0.95), "min": pct(vals, 0.0)}

    summary = {"case": case.name, "cmd": " ".join(shlex.quote(c) for c in case.cmd),
               "env": {k: v for k, v in case.env.items() if k.startswith("REFLEX_")}, "page_cache": cache,
               "cache_drop_method": method, "runs": len(rows), "failures": len(rows) - len(ok), "idle_watts": idle,
               "spawn_to_first_output_s": stat("spawn_to_first_output_s"), "spawn_to_exit_s": stat("spawn_to_exit_s")}
    if clock:
        for k in ("joules_to_first_output", "net_joules_to_first_output", "joules_to_exit", "net_joules_to_exit",
                  "child_joules_process_start_to_first_token", "child_energy_estimated_joules"):
            summary[k] = stat(k)
        summary["record_vs_external"] = energy_agreement(ok, clock)
        summary["record_vs_external_net"] = net_agreement(ok)
        summary["child_idle_watts"] = stat("child_idle_watts")
        summary["child_idle_sources"] = sorted({r.get("child_idle_source") for r in ok if r.get("child_idle_source")})
    stages = _median_stages([r["child_record"] for r in ok if "child_record" in r])
    if stages:
        summary["child_stages_ms"] = stages
    summary["rows"] = rows
    return summary


def _agreement(rows: list[dict], child_key: str, ext_key: str, floor_j: float) -> dict | None:
    """The child's own figure (child_key) against ours (ext_key) for the same runs: medians,
    per-run differences, and whether the medians agree within floor_j or 20% of ours, whichever is
    larger (`runs_within_bound`: the same test run by run)."""
    pairs = [(r[child_key], r[ext_key]) for r in rows if r.get(child_key) is not None and r.get(ext_key) is not None]
    if not pairs:
        return None
    diffs = [a - b for a, b in pairs]
    m_rec, m_ext = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)

    def bound(ext: float) -> float:
        return max(floor_j, 0.2 * abs(ext))

    return {"runs": len(pairs), "record_median_j": m_rec, "external_median_j": m_ext, "median_difference_j": m_rec - m_ext,
            "per_run_difference_j": {"p05": pct(diffs, 0.05), "p50": pct(diffs, 0.5), "p95": pct(diffs, 0.95)},
            "runs_within_bound": sum(abs(d) <= bound(b) for d, (_, b) in zip(diffs, pairs)),
            "bound_j": bound(m_ext), "agree": abs(m_rec - m_ext) <= bound(m_ext)}


def energy_agreement(rows: list[dict], clock: EnergyClock) -> dict | None:
    """Gross: the child's process-start -> first-token joules against ours over spawn -> first
    output, within one counter step or 20%."""
    out = _agreement(rows, "child_joules_process_start_to_first_token", "joules_to_first_output", clock.step_j or 0.0)
    return out and dict(out, counter_step_j=clock.step_j)


NET_BOUND_J = 3.0  # issue #25: net joules within 3 J or 20%, whichever is larger


def net_agreement(rows: list[dict]) -> dict | None:
    """Net: the child's joules above idle (its gross less its idle power over its window) against
    ours (our gross less the idle power we measured before spawning, over spawn -> first output)."""
    return _agreement(rows, "child_net_joules", "net_joules_to_first_output", NET_BOUND_J)


# the record's upload figures (gpu/runner.py, gpu/residency.py): what the first token waited for
UPLOAD_FIELDS = ("weights_bytes", "upload_ms", "upload_gb_s", "upload_threads", "upload_chunk_mb", "base_bytes",
                 "base_loaded_bytes", "resident_bytes_at_release",
                 "released_after_ms", "demand_waits", "demand_bytes", "demand_wait_ms", "demand_gb_s", "base_wait_ms",
                 "all_resident_ms")


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
    upload = {k: _median_or_none([r.get(k) for r in records]) for k in UPLOAD_FIELDS}
    return {"marks_at_ms": out, "background_ms": spans, "upload": {k: v for k, v in upload.items() if v is not None},
            "process_start_to_first_token_ms": statistics.median(c["process_start_to_first_token_ms"] for c in cs
                                                                  if c.get("process_start_to_first_token_ms")),
            "joules_process_start_to_first_token": _median_or_none([c.get("joules_process_start_to_first_token")
                                                                    for c in cs]),
            "energy_estimated_joules": _median_or_none([c.get("energy_estimated_joules") for c in cs]),
            "energy_estimated_span_ms": _median_or_none([c.get("energy_estimated_span_ms") for c in cs]),
            "joules_above_idle_process_start_to_first_token": _median_or_none(
                [c.get("joules_above_idle_process_start_to_first_token") for c in cs])}


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


def long_prompt(n_tokens: int) -> str:
    """About n_tokens of plain English (one token per word and comma, roughly, for BPE vocabularies)."""
    words = ("The capital of France is the city where the river Seine meets the old roads of the north and "
             "the markets of the south, and people have lived there for a very long time").split()
    return " ".join(words[i % len(words)] for i in range(max(1, int(n_tokens * 0.85))))


def parse_variant(spec: str) -> tuple[str, dict]:
    name, _, envs = spec.partition(":")
    env = {}
    for kv in filter(None, envs.split(",")):
        k, _, v = kv.partition("=")
        if not k.startswith("REFLEX_"):
            raise SystemExit(f"--variant {spec}: only REFLEX_* variables")
        env[k] = v
    return name, env


def parse_tree(spec: str) -> tuple[str, str, str | None]:
    name, _, rest = spec.partition("=")
    tree, _, kernels = rest.partition(":")
    if not name or not os.path.isdir(os.path.join(tree, "reflex_runtime")):
        raise SystemExit(f"--tree {spec}: DIR must hold a reflex_runtime package")
    return name, os.path.abspath(tree), os.path.abspath(kernels) if kernels else None


def tree_cmd(tree: str) -> list[str]:
    """`python -m reflex_runtime.cli` with `tree` first on sys.path (before the working directory,
    which `-m` would put first)."""
    launch = ("import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); sys.argv[0] = 'reflex'; "
              "runpy.run_module('reflex_runtime.cli', run_name='__main__', alter_sys=True)")
    return [sys.executable, "-c", launch, tree]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", default=[], help="GGUF file (repeatable)")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--prompt-tokens", type=int, default=0, help="use a prompt of about this many tokens instead")
    ap.add_argument("--cache", default="warm,cold", help="page-cache states to run: warm, cold")
    ap.add_argument("--system1", action="store_true", help="also time `reflex system1` with 3 candidates")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:REFLEX_X=V[,REFLEX_Y=W]",
                    help="also time `reflex generate` with these environment settings (repeatable)")
    ap.add_argument("--llama-simple", default=None, metavar="BIN", help="llama.cpp's llama-simple: timed on the same files")
    ap.add_argument("--embedded", action="store_true",
                    help="also time `reflex generate` with no --model (the embedded model, or $REFLEX_EMBEDDED_MODEL: "
                         "what a container image bakes in); llama-simple gets that file")
    ap.add_argument("--peer", action="append", default=[], metavar="NAME=CMD", help="another command to time the same way")
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=DIR[:KERNELS]",
                    help="`reflex generate` from the package in DIR (and its fatbin in KERNELS), interleaved with the "
                         "rest: an A/B of two checkouts in one run")
    ap.add_argument("--peer-runs", type=int, default=None, help="runs per peer (default: --runs)")
    ap.add_argument("--idle-s", type=float, default=2.0)
    ap.add_argument("--out", default=None, help="output folder (required unless --rows-from)")
    ap.add_argument("--compare-out", default=None, metavar="JSON",
                    help="write or extend this compare.json (../shared/RESULTS.md): cold_first_token_s[@dropped] and "
                         "joules_to_first_token of `reflex generate` against llama-simple, per --model")
    ap.add_argument("--commit", default=None, help="the tree that ran, for the compare rows (default: git HEAD)")
    ap.add_argument("--rows-from", action="append", default=[], metavar="RESULTS_JSON",
                    help="run nothing: write --compare-out's rows from these results.json of earlier runs (with "
                         "--commit naming the tree that ran them; a GPU machine's own git may name another)")
    args = ap.parse_args()
    if args.rows_from:
        if not args.compare_out:
            ap.error("--rows-from needs --compare-out")
        return rows_from(args.rows_from, args.compare_out, args.commit)
    if not args.out:
        ap.error("give --out FOLDER")
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    if not args.model and not args.embedded:
        ap.error("give --model FILE (repeatable) and/or --embedded")
    variants = [parse_variant(v) for v in args.variant]
    trees = [parse_tree(t) for t in args.tree]
    prompt = long_prompt(args.prompt_tokens) if args.prompt_tokens else args.prompt
    os.makedirs(args.out, exist_ok=True)
    try:
        nv = Nvml()
    except (OSError, AssertionError) as e:
        print(f"no NVML ({e}); timing only", file=sys.stderr)
        nv = None
    result = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "gpu": nv.name if nv else None,
              "prompt": prompt, "python": sys.version.split()[0], "cases": [], "interleaved": []}
    trace = EnergyClock(nv) if nv else None
    if nv:
        result["energy_counter"] = counter_resolution(nv)
        step = result["energy_counter"]["median_step_mj"]
        trace.step_j = step / 1000 if step else None
        check = run_case(Case("sleep 1 (method check: net must be ~0 J)", ["sleep", "1"]), 3, trace, None, "warm",
                         args.idle_s)
        result["method_check_sleep_1"] = {k: check[k] for k in ("idle_watts", "joules_to_exit", "net_joules_to_exit")}
    tmp = tempfile.mkdtemp()
    base = [sys.executable, "-m", "reflex_runtime.cli"]
    models = args.model + ([None] if args.embedded else [])
    for model in models:
        tag = os.path.basename(model) if model else "embedded model"
        margs = ["--model", model] if model else []
        peer_file = model or os.environ.get("REFLEX_EMBEDDED_MODEL")

        def rec(name):
            return os.path.join(tmp, name.replace(" ", "_") + ".json")

        cases = [Case(f"reflex generate {tag}", base + ["generate", prompt, "-n", "1", "--backend", "cuda", *margs,
                                                        "--record", rec("generate")], record_path=rec("generate"))]
        for name, env in variants:
            cases.append(Case(f"reflex generate {tag} [{name}]", base + ["generate", prompt, "-n", "1", "--backend", "cuda",
                                                                          *margs, "--record", rec(name)], env, rec(name)))
        for name, tree, kdir in trees:
            cases.append(Case(f"reflex generate {tag} [tree {name}]", tree_cmd(tree) + [
                "generate", prompt, "-n", "1", "--backend", "cuda", *margs, "--record", rec("tree-" + name)],
                {"REFLEX_KERNELS_DIR": kdir} if kdir else None, rec("tree-" + name)))
        if args.system1:
            cases.append(Case(f"reflex system1 {tag}", base + ["system1", prompt, "-c", " Paris", "-c", " London", "-c",
                                                               " Berlin", "--backend", "cuda", *margs, "--record",
                                                               rec("system1")], record_path=rec("system1")))
        if args.llama_simple and peer_file:
            cases.append(Case(f"llama-simple {tag}", [args.llama_simple, "-m", peer_file, "-n", "1", "-ngl", "99", prompt]))
        for cache in args.cache.split(","):
            if cache == "warm":
                summaries, diffs = run_interleaved(cases, args.runs, trace, peer_file, args.idle_s)
                result["cases"] += summaries
                result["interleaved"].append(diffs)
                for c in summaries:
                    _print_case(c)
                for name, d in diffs["minus_reference_first_output_ms"].items():
                    if d["rounds"]:
                        print(f"    per round, {name} - {diffs['reference_case']}: first output p50 {d['p50']:+.1f} ms, "
                              f"mean {d['mean']:+.1f} ms (p05 {d['p05']:+.1f}, p95 {d['p95']:+.1f})", flush=True)
            elif cache == "cold" and model:
                disk = result.setdefault("disk_read", {})[tag] = disk_read_rate(model)
                print(f"  disk read with the page cache dropped: {disk['gb_s']} GB/s ({disk['bytes'] / 1e9:.1f} GB "
                      f"on {disk['threads']} threads, {disk['cache_drop_method']})", flush=True)
                for c in cases:
                    summary = run_case(c, args.runs, trace, model, "cold", args.idle_s)
                    result["cases"].append(summary)
                    _print_case(summary)
    for peer in args.peer:
        name, _, cmd = peer.partition("=")
        c = run_case(Case(name, shlex.split(cmd)), args.peer_runs or args.runs, trace, None, "warm", args.idle_s)
        result["cases"].append(c)
        _print_case(c)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
    waterfall(result["cases"], os.path.join(args.out, "waterfall.png"))
    if args.compare_out:
        from compare_json import write_compare

        rows = [r for m in args.model for r in compare_rows(result, os.path.basename(m))]
        write_compare(args.compare_out, rows, result["gpu"], args.commit)
        print(f"{len(rows)} rows -> {args.compare_out}")
    return 0


def rows_from(paths: list[str], compare_out: str, commit: str | None) -> int:
    """compare.json rows of the models in earlier runs' results.json: each `reflex generate X.gguf`
    case with a llama-simple case of the same file."""
    from compare_json import write_compare

    for p in paths:
        try:
            with open(p) as f:
                result = json.load(f)
            tags = sorted({c["case"].removeprefix("llama-simple ") for c in result["cases"]
                           if c["case"].startswith("llama-simple ")})
            rows = [r for t in tags for r in compare_rows(result, t)]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            print(f"bench_coldstart: {p} is not a results.json of this script ({type(e).__name__}: {e})", file=sys.stderr)
            return 2
        if not rows:
            print(f"bench_coldstart: {p} holds no `reflex generate` case with a llama-simple case of the same file",
                  file=sys.stderr)
            return 1
        write_compare(compare_out, rows, result.get("gpu"), commit)
        print(f"{len(rows)} rows of {p} -> {compare_out}")
    return 0


def compare_rows(result: dict, tag: str) -> list[dict]:
    """RESULTS.md rows of one model file (tag: its basename): `reflex generate` against
    llama-simple, p50 of each page-cache state."""
    from compare_json import row

    by = {(c["case"], c["page_cache"]): c for c in result["cases"]}
    rows = []
    for cache, suffix in (("warm", ""), ("cold", "@dropped")):
        ours, peer = by.get((f"reflex generate {tag}", cache)), by.get((f"llama-simple {tag}", cache))
        if not ours or not peer:
            continue
        file = tag.removesuffix(".gguf")
        a, b = ours["spawn_to_first_output_s"]["p50"], peer["spawn_to_first_output_s"]["p50"]
        if a and b:
            rows.append(row(file, "cold_first_token_s" + suffix, round(a, 4), round(b, 4), rate=False))
        a, b = (c.get("joules_to_first_output", {}).get("p50") for c in (ours, peer))
        if a and b and cache == "warm":
            rows.append(row(file, "joules_to_first_token", round(a, 2), round(b, 2), rate=False))
    return rows


def _print_case(c: dict) -> None:
    f, x = c["spawn_to_first_output_s"], c["spawn_to_exit_s"]
    line = (f"{c['case']:<56} {c['page_cache']:<4} first p50 {_ms(f['p50'])} p90 {_ms(f['p90'])}  exit p50 {_ms(x['p50'])}"
            f"  fails {c['failures']}")
    if "joules_to_first_output" in c:
        line += (f"  J first {_j(c['joules_to_first_output']['p50'])} (net {_j(c['net_joules_to_first_output']['p50'])})"
                 f"  J exit {_j(c['joules_to_exit']['p50'])}")
    print(line, flush=True)
    agree = c.get("record_vs_external")
    if agree:
        print(f"    energy, child record vs external (medians): {agree['record_median_j']:.1f} J vs "
              f"{agree['external_median_j']:.1f} J, difference {agree['median_difference_j']:+.1f} J, bound "
              f"{agree['bound_j']:.1f} J: {'AGREE' if agree['agree'] else 'DISAGREE'}", flush=True)
    net = c.get("record_vs_external_net")
    if net:
        idle = c.get("child_idle_watts") or {}
        print(f"    net energy, child record vs external (medians): {net['record_median_j']:.1f} J vs "
              f"{net['external_median_j']:.1f} J (external idle {_j(c.get('idle_watts'))} W, child idle p50 "
              f"{_j(idle.get('p50'))} W from {', '.join(c.get('child_idle_sources') or ['?'])}), difference "
              f"{net['median_difference_j']:+.1f} J, bound {net['bound_j']:.1f} J, runs within {net['runs_within_bound']}/"
              f"{net['runs']}: {'AGREE' if net['agree'] else 'DISAGREE'}", flush=True)
    st = c.get("child_stages_ms")
    if st:
        marks = " ".join(f"{k}@{v:.0f}" for k, v in sorted(st["marks_at_ms"].items(), key=lambda kv: kv[1]))
        spans = " ".join(f"{k}[{a:.0f}-{b:.0f}]" for k, (a, b) in sorted(st["background_ms"].items(), key=lambda kv: kv[1][0]))
        print(f"    child marks (ms from process start): {marks}", flush=True)
        print(f"    child threads: {spans}", flush=True)
        if st.get("upload"):
            print("    child upload (medians): " + " ".join(f"{k} {v:g}" for k, v in st["upload"].items()), flush=True)
        print(f"    child first token {st['process_start_to_first_token_ms']:.1f} ms, "
              f"{st['joules_process_start_to_first_token']} J (of which estimated {st['energy_estimated_joules']} J over "
              f"{st['energy_estimated_span_ms']} ms; {st['joules_above_idle_process_start_to_first_token']} J above idle)",
              flush=True)


def _ms(v):
    return f"{v * 1000:7.1f} ms" if v is not None else "   n/a"


def _j(v):
    return f"{v:6.1f}" if v is not None else "n/a"


if __name__ == "__main__":
    sys.exit(main())
