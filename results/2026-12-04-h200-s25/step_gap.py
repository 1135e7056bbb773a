#!/usr/bin/env python3
"""For the next session (prepared, not run): with mvs_trace2.patch applied (and the fatbin rebuilt), where
the 0.6B decode step's time goes between its layers and between two steps. The bench's 1,277 tok/s is
783 us a token; the stamps of call 4 account for ~560 us of layers (19.9 us each at an 8-token context)
and ~85 us of LM head. This queues STEPS graph launches the way runner.decode does (each followed by the
token's read-back copy and its event), with the stamp counter reset once, and prints per step: the first
matrix launch's earliest entry, its layers' span, the LM head's span, and the gap from one step's LM head
end to the next step's first matrix entry (the embedding kernel, the graph boundary, the read-back copy).
Usage: python3 step_gap.py MODEL [STEPS] [DEPTH]"""
import sys

from mvs_trace2 import launches_of, traced

model = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 6
depth = int(sys.argv[3]) if len(sys.argv) > 3 else 8


def queue(runner, graph):  # as runner.decode queues them: the graph, then the token's copy and event
    for i in range(steps):
        graph.launch(runner.stream)
        runner.read_back(i)


runner, t = traced(model, depth, queue)
launches = launches_of(t)
per_step = 4 * runner.config.n_layers + 1  # a dense layer's four matrix launches, then the LM head
if len(launches) != steps * per_step:  # consecutive steps' launches of the same tag would merge
    print(f"{len(launches)} launch runs for {steps} steps of {per_step}: tags merged, read the raw stamps")
print(f"{steps} steps queued back to back, context {depth}; us")
prev_end = None
for k in range(min(steps, len(launches) // per_step)):
    ls = launches[k * per_step:(k + 1) * per_step]
    first, head = ls[0][:, 1].min(), ls[-1]
    layers = (ls[-2][:, 5].max() - first) / 1e3
    headspan = (head[:, 5].max() - ls[-2][:, 5].max()) / 1e3
    gap = (first - prev_end) / 1e3 if prev_end is not None else float("nan")
    total = (head[:, 5].max() - prev_end) / 1e3 if prev_end is not None else float("nan")
    print(f"  step {k}: gap before it {gap:7.2f}  layers {layers:7.2f}  LM head {headspan:6.2f}  end to end {total:7.2f}")
    prev_end = head[:, 5].max()
