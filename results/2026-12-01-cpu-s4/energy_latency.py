import sys, time, statistics, threading
sys.path.insert(0, "tests")
from fake_engine import make_engine
from reflex_runtime.engine import GenerateRequest, Finished
def counter():
    time.sleep(0.006)  # an NVML read of ~6 ms
    return 1000.0 * time.perf_counter()
for energy in (None, counter):
    eng = make_engine(delay=0.0011)
    eng.start_scheduler(energy=energy)
    lat = []
    for i in range(8):
        t0 = time.perf_counter()
        for ev in eng.generate(GenerateRequest(prompt="hi", max_tokens=128, ignore_eos=True)):
            if isinstance(ev, Finished): break
        lat.append(time.perf_counter() - t0)
    eng.stop_scheduler()
    print("energy" if energy else "none  ", "latency p50 %.1f ms" % (1000 * statistics.median(lat)))
