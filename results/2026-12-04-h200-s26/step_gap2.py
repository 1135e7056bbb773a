#!/usr/bin/env python3
"""Session 26: where the 0.6B decode loop's time goes between steps, without instrumented kernels.
After a DEPTH-token prefill, per token (median of REPEATS runs of N tokens, microseconds):
  graph        N decode-graph replays back to back (GPU time, events around them: reflex bench --depths)
  graph+event  each replay followed by an event record (what a token in mapped memory would need)
  graph+copy   each replay followed by the token's 4-byte read-back copy and its event (runner.decode's queue)
  loop         runner.generate_ids (the decode loop, host included), wall time per token after the first
  engine       engine.generate's record: decode_tokens_per_s as reflex bench reports it
and, for the loop, the host's time per token outside the waits for the GPU.
Usage: python3 step_gap2.py MODEL [N] [DEPTH] [REPEATS]"""
import json
import os
import statistics
import sys
import time

from reflex_runtime.engine import Finished, GenerateRequest
from reflex_runtime.gpu.step import Seq, Step
from reflex_runtime.loader import load_engine
from reflex_runtime.sampling import SamplingParams

model = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 128
depth = int(sys.argv[3]) if len(sys.argv) > 3 else 8
repeats = int(sys.argv[4]) if len(sys.argv) > 4 else 5

engine = load_engine(model, "cuda", max_context=4096)
runner = engine.runner
runner.wait_weights()
dev, s = runner.dev, runner.stream
graph = runner.step_graph(greedy=True)
ids = [(7 * i + 11) % 1000 + 1 for i in range(depth)]
start, end = dev.event(timing=True), dev.event(timing=True)
ev = dev.event()


def gpu_us(queue_one):
    times = []
    for _ in range(repeats + 1):
        runner.prefill_greedy(ids)
        dev.sync(s)
        dev.record(start, s)
        for i in range(n):
            queue_one(i)
        dev.record(end, s)
        dev.wait_event(end)
        times.append(dev.elapsed_ms(start, end) * 1000 / n)
    return statistics.median(times[1:])


def with_event(i):
    graph.launch(s)
    dev.record(ev, s)


def with_copy(i):
    graph.launch(s)
    runner.read_back(i)


res = {"model": os.path.basename(model), "tokens": n, "depth": depth,
       "graph": gpu_us(lambda i: graph.launch(s)), "graph+event": gpu_us(with_event), "graph+copy": gpu_us(with_copy)}

# the decode loop: wall time per token after the first, and the time the host spends waiting
waits = []
orig_token = runner.token


def timed_token(i):
    t = time.perf_counter()
    tok = orig_token(i)
    waits.append(time.perf_counter() - t)
    return tok


runner.token = timed_token
loop, host = [], []
for _ in range(repeats + 1):
    waits.clear()
    stamps = []
    for _tok in runner.generate_ids(ids, SamplingParams(temperature=0.0), n + 1, stop_ids=set()):
        stamps.append(time.perf_counter())
    wall = stamps[-1] - stamps[0]
    loop.append(wall * 1e6 / n)
    host.append((wall - sum(waits[1:])) * 1e6 / n)
runner.token = orig_token
res["loop"], res["loop_host_outside_waits"] = statistics.median(loop[1:]), statistics.median(host[1:])
rates = []
for _ in range(repeats + 1):
    for e in engine.generate(GenerateRequest(prompt="The capital of France is", max_tokens=n, ignore_eos=True)):
        if isinstance(e, Finished):
            rates.append(e.record["decode_tokens_per_s"])
res["engine"] = 1e6 / statistics.median(rates[1:])
print(f"{res['model']}: {n} tokens after {depth} of context, us per token (tok/s)")
for k in ("graph", "graph+event", "graph+copy", "loop", "engine"):
    print(f"  {k:<12} {res[k]:8.1f}  ({1e6 / res[k]:7.1f} tok/s)")
print(f"  loop: host time outside the waits {res['loop_host_outside_waits']:.1f} us per token")
with open(os.path.join(os.environ.get("OUT", "."), f"step_gap2-{res['model']}.json"), "w") as f:
    json.dump(res, f, indent=1)
