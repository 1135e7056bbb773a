#!/usr/bin/env python3
"""The host's side of a GPU forward, measured with no GPU: how long Python takes to enqueue an
eager prompt (the launches a prefill and its pick make), per launch, on any machine.

    python scripts/bench_host.py MODEL.gguf [--tokens 16,128,512] [--repeats 30] [--out host.json]
        [--profile] [--tree DIR]

Why: a short prompt's time is the host's (s38: a 16-token prompt of the Qwen3-0.6B shape is 1.97 ms
of GPU work behind ~3.5 ms of enqueueing, 15-17 us a launch on the GPU machine, of which the bindings'
cuLaunchKernel is 5.7-5.9). Everything but the driver runs here as it runs there: the runner, blocks
and ops pick kernels and build argument packs, and gpu.driver.Kernel.launch packs its pointer array;
only the bindings' launch and attribute calls are stubbed (they return success at once), and memory
is address ranges (tests/fake_device.py). So the figure is our Python per launch; add the bindings'
~5.8 us for the GPU machine's total. Medians of --repeats runs after one warm run; JSON on stdout
and in --out. --profile adds cProfile's top functions (by own time) on stderr. --tree: time another
checkout's reflex_runtime package (e.g. a `git worktree` of an older commit) with this fake device.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Bindings:
    """cuda.bindings.driver with the calls a launch makes answered at once (success)."""

    def __init__(self, real):
        self._real, self._ok = real, (real.CUresult.CUDA_SUCCESS,)

    def __getattr__(self, name):
        return getattr(self._real, name)

    def cuLaunchKernel(self, *args):
        return self._ok

    def cuLaunchKernelEx(self, *args):
        return self._ok

    def cuFuncSetAttribute(self, *args):
        return self._ok

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, func, block, shmem):
        return self._ok[0], min(2048 // block, 232448 // (shmem + 1024))


def null_device():
    """tests/fake_device.FakeDevice whose kernels are gpu.driver.Kernel over the stubbed bindings."""
    from fake_device import FakeDevice
    from reflex_runtime.gpu import driver

    driver.cu = _Bindings(driver.cu)

    class NullDevice(FakeDevice):
        def __init__(self):
            super().__init__({})
            self._kernels = {}

        def kernel(self, name):
            k = self._kernels.get(name)
            if k is None:
                k = self._kernels[name] = driver.Kernel(name, None)
            return k

        def _device_range(self, ptr, nbytes, what):
            pass  # (the tests check ranges; the benchmark times the host)

    return NullDevice()


def measure(path: str, tokens: list[int], repeats: int, profile: bool) -> dict:
    from bench_prompt import prompt_ids  # the prompts bench_prompt.py times on the GPU
    from fake_device import FakeBoot
    from reflex_runtime.families import gpu_model_class, read_config
    from reflex_runtime.gpu.runner import CudaRunner
    from reflex_runtime.measure.coldstart import Timeline
    from reflex_runtime.modelfile.gguf_file import GGUFFile

    g = GGUFFile(path)
    cfg = read_config(g)
    dev = null_device()
    runner = CudaRunner.start(FakeBoot(dev), g, cfg, Timeline(), gpu_model_class(cfg), max_context=max(tokens) + 8)
    runner.wait_ready()
    runner.wait_weights()
    rows = []
    for n in tokens:
        ids = prompt_ids(runner, n)
        first = time.perf_counter()
        runner.prefill_greedy(ids)  # the first of this length: lru caches and kernel attributes filled
        first = time.perf_counter() - first
        before = runner.launch.launches
        runner.prefill_greedy(ids)
        launches = runner.launch.launches - before
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            runner.prefill_greedy(ids)
            times.append(time.perf_counter() - t)
        ms = statistics.median(times) * 1e3
        rows.append({"tokens": n, "launches": launches, "host_ms": round(ms, 4),
                     "host_us_per_launch": round(ms * 1e3 / launches, 3),
                     "host_ms_range": [round(min(times) * 1e3, 4), round(max(times) * 1e3, 4)],
                     "first_run_ms": round(first * 1e3, 4)})
        print(f"{os.path.basename(path)} {n} tokens: {launches} launches, host {ms:.3f} ms "
              f"({ms * 1e3 / launches:.2f} us a launch; first run {first * 1e3:.2f} ms)", file=sys.stderr)
    if profile:
        ids = prompt_ids(runner, tokens[0])
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(repeats):
            runner.prefill_greedy(ids)
        pr.disable()
        out = io.StringIO()
        pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(30)
        print(out.getvalue(), file=sys.stderr)
    return {"file": os.path.basename(path), "arch": cfg.arch, "layers": cfg.n_layers, "python": platform.python_version(),
            "machine": platform.processor() or platform.machine(), "repeats": repeats,
            "what": "host time to enqueue an eager prefill + greedy pick, driver calls stubbed", "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", default="16,128,512")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--out")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--tree", default=ROOT, help="the checkout whose reflex_runtime is timed (default: this one)")
    a = ap.parse_args(argv)
    if not os.path.isdir(os.path.join(a.tree, "reflex_runtime")):
        print(f"bench_host: --tree {a.tree} holds no reflex_runtime package", file=sys.stderr)
        return 2
    sys.path[:0] = [os.path.abspath(a.tree), os.path.join(ROOT, "tests")]
    try:
        tokens = [int(t) for t in a.tokens.split(",")]
        if not tokens or min(tokens) < 1 or a.repeats < 1:
            raise ValueError
    except ValueError:
        print(f"bench_host: --tokens takes positive integers separated by commas (got {a.tokens!r}) "
              f"and --repeats a positive integer", file=sys.stderr)
        return 2
    if not os.path.isfile(a.model):
        print(f"bench_host: no such model file: {a.model}", file=sys.stderr)
        return 2
    result = measure(a.model, tokens, a.repeats, a.profile)
    result["tree"] = os.path.abspath(a.tree)
    text = json.dumps(result, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
