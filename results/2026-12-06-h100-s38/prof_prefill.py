"""Where an eager prefill's time goes (s38): host time to enqueue it, GPU time with the host's gaps
(events around the eager launches), GPU time of the same launches replayed as one graph (no host),
and cProfile's top functions. python3 prof_prefill.py FILE [N ...]"""
import cProfile, io, pstats, statistics, sys, time

from reflex_runtime.commands.bench import _events_ms
from reflex_runtime.loader import load_engine

path, ns = sys.argv[1], [int(x) for x in sys.argv[2:]] or [16, 128, 512]
engine = load_engine(path, "cuda")
r = engine.runner
r.wait_weights()
dev, s = r.dev, r.stream
for n in ns:
    ids = [(7 * i + 11) % min(r.config.vocab_size, 1000) + 1 for i in range(n)]
    r.prefill_greedy(ids); dev.sync(s)
    host = []
    for _ in range(10):
        t = time.perf_counter(); r.prefill_greedy(ids); host.append((time.perf_counter() - t) * 1e3); dev.sync(s)
    eager = _events_ms(dev, s, lambda: r.prefill_greedy(ids), 10)
    launches = r.prefill_launches(n)
    g = r.graph_of(launches)
    g.launch(s)
    graph = _events_ms(dev, s, lambda: g.launch(s), 10)
    print(f"{path.split('/')[-1]} n={n}: launches {len(launches)}, host enqueue {statistics.median(host):.3f} ms "
          f"({statistics.median(host) * 1e3 / len(launches):.1f} us a launch), eager GPU {eager:.3f} ms, "
          f"as one graph {graph:.3f} ms", flush=True)
n = 128 if 128 in ns else ns[0]
ids = [(7 * i + 11) % min(r.config.vocab_size, 1000) + 1 for i in range(n)]
pr = cProfile.Profile()
pr.enable()
for _ in range(20):
    r.prefill_greedy(ids)
pr.disable()
dev.sync(s)
for key in ("tottime", "cumtime"):
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats(key).print_stats(28)
    print("\n".join(out.getvalue().splitlines()[:45]))
