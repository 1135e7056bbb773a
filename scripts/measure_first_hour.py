#!/usr/bin/env python3
"""A newcomer's first hour, measured: what README says to do, from `git clone` of one commit to the
demo's answer and the test run, each path in its own fresh clone, fresh venv and empty caches.

    python3 scripts/measure_first_hour.py [--repo URL|PATH] [--commit REV] [--steps light,kernels,tests]
                                          [--out first_hour.json] [--keep DIR]

Paths (each: git clone -> python3 -m venv -> the install -> what it is for):
  light    REFLEX_SKIP_KERNELS=1 pip install '.[embedded]', then the demo (target: answer <= 2 min)
  kernels  pip install '.[embedded]' (nvcc builds the kernels for every architecture; a kernel that
           fails to build fails the install), then the demo (target: answer <= 8 min)
  tests    pip install -e '.[dev]', then README's `pytest` under /usr/bin/time -v, twice: the first
           run builds the test fixtures into the empty test cache, the second finds them
           (target for each: <= 15 min, peak RSS <= 4 GB)
The demo is README's `reflex generate "The capital of France is the city of"`; it must say Paris.
Caches (pip's, the model cache, the test cache: XDG_CACHE_HOME, REFLEX_CACHE, REFLEX_TEST_CACHE)
start empty in the work folder, as on a new machine; --warm-caches keeps the user's instead.

Prints a table and writes JSON. The figures are only worth writing down from a quiet machine: the
JSON records the CPU count and the load average at the start and the end of each path.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO_PROMPT = "The capital of France is the city of"
TARGETS = {"light": 120, "kernels": 480, "tests": 900}  # seconds
TARGET_RSS_MB = 4096
PATHS = ("light", "kernels", "tests")
DEV_ONLY = ("torch", "transformers", "pytest")  # what only `.[dev]` brings


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run(cmd: list[str], cwd: Path, env: dict, timeout: float, capture: bool = False) -> tuple[float, subprocess.CompletedProcess]:
    """Run one step as the newcomer would type it; (seconds, result). A failing step raises."""
    log(f"$ {' '.join(cmd)}    (in {cwd})")
    t = time.monotonic()
    r = subprocess.run(cmd, cwd=cwd, env=env, timeout=timeout, text=True, stdin=subprocess.DEVNULL,
                       capture_output=capture)
    dt = round(time.monotonic() - t, 1)
    log(f"  {dt} s, exit {r.returncode}")
    if r.returncode != 0:
        tail = ((r.stdout or "") + (r.stderr or ""))[-2000:] if capture else ""
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode} after {dt} s\n{tail}")
    return dt, r


class Newcomer:
    """One path: its own folder, clone and venv; `env` is what its shell would have."""

    def __init__(self, work: Path, name: str, repo: str, commit: str, warm_caches: bool):
        self.dir = work / name
        self.dir.mkdir(parents=True)
        self.clone = self.dir / "reflex-runtime"
        self.venv = self.dir / "venv"
        self.repo, self.commit = repo, commit
        env = {k: v for k, v in os.environ.items() if not k.startswith(("REFLEX_", "VIRTUAL_ENV", "PYTHON"))}
        if not warm_caches:
            cache = self.dir / "cache"
            env.update(XDG_CACHE_HOME=str(cache), REFLEX_CACHE=str(cache / "reflex-runtime"),
                       REFLEX_TEST_CACHE=str(cache / "reflex-runtime" / "test"))
        env.update(PATH=f"{self.venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}", VIRTUAL_ENV=str(self.venv),
                   PIP_DISABLE_PIP_VERSION_CHECK="1")
        self.env = env
        self.result: dict = {"load_start": loadavg()}

    def setup(self) -> None:
        self.result["clone_s"] = run(["git", "clone", "-q", self.repo, str(self.clone)], self.dir, self.env, 900)[0]
        run(["git", "checkout", "-q", self.commit], self.clone, self.env, 120)
        self.result["venv_s"] = run([sys.executable, "-m", "venv", str(self.venv)], self.dir, self.env, 300)[0]

    def install(self, spec: str, editable: bool = False, **env) -> None:
        cmd = ["pip", "install", "-q"] + (["-e"] if editable else []) + [spec]
        self.result["install_s"] = run(cmd, self.clone, {**self.env, **env}, 3600)[0]
        self.result["install_command"] = " ".join([*(f"{k}={v}" for k, v in env.items()), *cmd])

    def has(self, dist: str) -> bool:
        r = subprocess.run(["pip", "show", "-q", dist], env=self.env, capture_output=True, timeout=120)
        return r.returncode == 0

    def demo(self) -> None:
        # From the work folder, not the clone: the installed package answers, not the source tree.
        dt, r = run(["reflex", "generate", DEMO_PROMPT], self.dir, self.env, 1800, capture=True)
        m = re.search(r"process_start_to_first_token_ms=([\d.]+)", r.stderr)
        self.result.update(demo_s=dt, answer=r.stdout.strip()[:200], answer_ok="Paris" in r.stdout,
                           first_token_ms=float(m.group(1)) if m else None)
        doctor = json.loads(run(["reflex", "doctor", "--json"], self.dir, self.env, 300, capture=True)[1].stdout)
        self.result["kernels"] = doctor.get("kernels")

    def pytest(self, run_no: int) -> dict:
        """README's `pytest` in the clone under /usr/bin/time -v: the first run builds the test
        fixtures into the (empty) test cache, a second one finds them there."""
        timing, logfile = self.dir / f"pytest-{run_no}.time", self.dir / f"pytest-{run_no}.log"
        t = time.monotonic()
        with open(logfile, "w") as out:
            log(f"$ /usr/bin/time -v pytest    (in {self.clone}; output in {logfile})")
            r = subprocess.run(["/usr/bin/time", "-v", "-o", str(timing), "pytest"], cwd=self.clone, env=self.env,
                               stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=4 * 3600)
        wall = round(time.monotonic() - t, 1)
        rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", timing.read_text())
        tail = logfile.read_text().strip().splitlines()
        run = {"load_start": self.result["load_start"] if run_no == 1 else loadavg(), "pytest_wall_s": wall,
               "pytest_exit": r.returncode, "peak_rss_mb": round(int(rss.group(1)) / 1024) if rss else None,
               "pytest_summary": tail[-1].strip("= ") if tail else "",
               "test_cache_mb": du_mb(Path(self.env.get("REFLEX_TEST_CACHE")
                                           or Path.home() / ".cache" / "reflex-runtime" / "test")),
               "load_end": loadavg(), "target_s": TARGETS["tests"]}
        run["met"] = (run["pytest_exit"] == 0 and wall <= TARGETS["tests"]
                      and (run["peak_rss_mb"] or 1e9) <= TARGET_RSS_MB)
        return run

    def finish(self, target_key: str) -> dict:
        res = self.result
        res["load_end"] = loadavg()
        if target_key in ("light", "kernels"):
            res["clone_to_answer_s"] = round(sum(res.get(k, 0) for k in ("clone_s", "venv_s", "install_s", "demo_s")), 1)
            res["met"] = bool(res.get("answer_ok")) and res["clone_to_answer_s"] <= TARGETS[target_key]
        else:
            res["met"] = all(r["met"] for r in res["runs"])
        res["target_s"] = TARGETS[target_key]
        return res


def du_mb(path: Path) -> float | None:
    if not path.exists():
        return None
    total = sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
    return round(total / 2**20, 1)


def measure(name: str, nc: Newcomer, pytest_runs: int) -> dict:
    nc.setup()
    if name == "light":
        nc.install(".[embedded]", REFLEX_SKIP_KERNELS="1")
        nc.result["dev_packages"] = [d for d in DEV_ONLY if nc.has(d)]  # the light path must have none
        nc.demo()
    elif name == "kernels":
        nc.install(".[embedded]", REFLEX_REQUIRE_KERNELS="1")
        nc.demo()
    else:
        nc.install(".[dev]", editable=True)
        nc.result["runs"] = []
        for i in range(1, pytest_runs + 1):  # saved as it goes: the JSON is rewritten after each path
            nc.result["runs"].append(nc.pytest(i))
    return nc.finish(name)


def table(report: dict) -> str:
    rows = [("path", "clone", "venv", "install", "demo/pytest", "total", "target", "met", "notes")]
    for name in PATHS:
        r = report["paths"].get(name)
        if r is None:
            continue
        if "error" in r:
            rows.append((name, "", "", "", "", "", "", "no", r["error"].splitlines()[0][:60]))
            continue
        if name == "tests":
            rows.append((name, r.get("clone_s"), r.get("venv_s"), r.get("install_s"), "", "", "", "", "pip install -e '.[dev]'"))
            for i, run in enumerate(r.get("runs", []), 1):
                notes = (f"peak RSS {run['peak_rss_mb']} MB (<= {TARGET_RSS_MB}), exit {run['pytest_exit']}, "
                         f"test cache {run['test_cache_mb']} MB, {run['pytest_summary'][:50]}")
                rows.append((f"  pytest #{i}", "", "", "", run["pytest_wall_s"], run["pytest_wall_s"],
                             f"<= {run['target_s']} s", "yes" if run["met"] else "no", notes))
            continue
        else:
            step, total = r.get("demo_s"), r.get("clone_to_answer_s")
            notes = f"first token {r.get('first_token_ms')} ms, answer {'ok' if r.get('answer_ok') else 'WRONG'}"
        rows.append((name, r.get("clone_s"), r.get("venv_s"), r.get("install_s"), step, total, f"<= {r['target_s']} s",
                     "yes" if r.get("met") else "no", notes))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", default=str(ROOT), help="what to clone (default: this checkout)")
    ap.add_argument("--commit", default="HEAD", help="commit to check out (default: the repo's HEAD)")
    ap.add_argument("--steps", default=",".join(PATHS), help=f"paths to run, of {','.join(PATHS)}")
    ap.add_argument("--out", default="first_hour.json", help="JSON report")
    ap.add_argument("--keep", default=None, help="work in this folder and keep it (default: a temp folder, removed)")
    ap.add_argument("--warm-caches", action="store_true", help="use the user's caches instead of empty ones")
    ap.add_argument("--pytest-runs", type=int, default=2,
                    help="tests path: run pytest this many times (the first fills the empty test cache; default 2)")
    args = ap.parse_args(argv)
    steps = [s for s in args.steps.split(",") if s]
    if not steps or set(steps) - set(PATHS):
        ap.error(f"--steps: choose from {','.join(PATHS)}")
    commit = subprocess.run(["git", "rev-parse", args.commit], cwd=args.repo if os.path.isdir(args.repo) else None,
                            capture_output=True, text=True).stdout.strip() or args.commit
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="reflex-first-hour-"))
    work.mkdir(parents=True, exist_ok=True)
    report = {"repo": args.repo, "commit": commit, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "cpus": os.cpu_count(), "mem_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
              "python": sys.version.split()[0], "caches": "warm (the user's)" if args.warm_caches else "empty",
              "work": str(work), "paths": {}}
    try:
        for name in steps:
            log(f"== {name}")
            nc = Newcomer(work, name, args.repo, commit, args.warm_caches)
            try:
                report["paths"][name] = measure(name, nc, args.pytest_runs)
            except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError) as e:
                report["paths"][name] = {**nc.result, "error": str(e), "met": False, "target_s": TARGETS[name]}
            Path(args.out).write_text(json.dumps(report, indent=2) + "\n")  # after each path: a long run keeps what it has
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(table(report))
    print(f"(commit {commit[:10]}, {report['cpus']} CPUs; load average per path in {args.out})")
    return 0 if all(r.get("met") for r in report["paths"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
