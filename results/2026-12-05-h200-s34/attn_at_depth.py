"""Decode-graph replays after a prefill of DEPTH tokens, with the CUDA profiler range around one replay
(ncu --profile-from-start off): the decode attention's launches at that context and nothing else."""
import sys

from cuda.bindings import driver as cu

from reflex_runtime.loader import load_engine

path, depth = sys.argv[1], int(sys.argv[2])
engine = load_engine(path, "cuda", max_context=depth + 64)
r = engine.runner
r.wait_weights()
graph = r.step_graph(greedy=True)
r.prefill_greedy([(7 * i + 11) % 1000 + 1 for i in range(depth)])
r.dev.sync(r.stream)
for _ in range(2):  # warm
    graph.launch(r.stream)
r.dev.sync(r.stream)
cu.cuProfilerStart()
graph.launch(r.stream)
r.dev.sync(r.stream)
cu.cuProfilerStop()
print("replayed at depth", depth)
