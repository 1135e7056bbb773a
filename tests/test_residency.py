"""gpu/residency.py on the CPU: a MoE file's weights split into the base and its routed experts,
and uploaded base first, then the experts a forward asks for, then the rest, through a fake
device whose "device memory" is a host buffer and whose async copies run at once."""

import ctypes
import os
import threading
import time

import pytest
from fake_device import HostMemoryDevice

from reflex_runtime.errors import ModelFileError
from reflex_runtime.gpu import residency
from reflex_runtime.gpu.ops import scatter
from reflex_runtime.gpu.residency import ExpertTensor, UploadPlan, WeightStream, plan_upload
from reflex_runtime.gpu.upload import StagingRing
from reflex_runtime.modelfile.gguf_file import GGUFFile


class _Dev(HostMemoryDevice):
    """Device memory as one host buffer (and the upload's scratch as others); htod copies at once,
    after `delay` seconds; kernels/scatter.cu's kernel runs as its Python reference at launch."""

    sm_count, cc, max_shared, smem_per_sm = 132, (9, 0), 227 << 10, 228 << 10  # what a Launcher reads

    def __init__(self, size: int, delay: float = 0.0):
        super().__init__(size)
        self.delay = delay
        self.scratch: dict[int, object] = {}
        self.packs: list[int] = []  # pieces per scatter launch

    def alloc(self, n):
        buf = (ctypes.c_char * n)()
        self.scratch[ctypes.addressof(buf)] = buf
        return ctypes.addressof(buf)

    def _inside(self, ptr, n):
        return (self.base <= ptr and ptr + n <= self.base + len(self.mem)) or any(
            a <= ptr and ptr + n <= a + len(b) for a, b in self.scratch.items())

    def htod(self, dst, src, n, stream):
        if self.delay:
            time.sleep(self.delay)
        assert self._inside(dst, n)
        ctypes.memmove(dst, src, n)

    def kernel(self, name):
        assert name == "reflex_scatter_pieces", name
        return self

    def launch(self, grid, block, args, stream, shmem=0, pdl=False, carveout=None):
        pack, n = args[0].value, args[1].value
        assert grid == (n, scatter.SLICES, 1) and 2 <= n <= scatter.MAX_PIECES and self._inside(pack, 1)
        for dst, at, size in scatter_ref_rows(pack, n):
            assert at % scatter.ALIGN == 0 and at >= scatter.header_bytes(n) and self._inside(dst, size)
            ctypes.memmove(dst, pack + at, size)
        self.packs.append(n)


def scatter_ref_rows(pack: int, n: int):
    """The pack's header as the kernel reads it: (destination, offset in the pack, bytes) rows."""
    return [scatter.PIECE.unpack(ctypes.string_at(pack + i * scatter.PIECE.size, scatter.PIECE.size)) for i in range(n)]


@pytest.fixture(autouse=True)
def _no_idle_release(monkeypatch):
    """The background upload starts only when a test says so (not after a slow moment here)."""
    monkeypatch.setattr(residency, "IDLE_RELEASE_S", 3600.0)


def _moe_file(arch):
    from fixtures import make_fixture

    if arch == "deepseek":
        from fixtures.deepseek import GPU_CONFIGS

        base, overrides = GPU_CONFIGS["v2lite"]
        return str(make_fixture(base, "q4_k_m", **overrides).gguf)
    return str(make_fixture(arch, "q4_k_m").gguf)


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen35moe", "deepseek"])
def test_the_plan_splits_the_weights_into_base_and_experts(arch):
    """Every byte of the tensor data is in the base or in exactly one expert of one layer; an
    expert is a contiguous slice of each of its layer's stacked tensors; only MoE layers have them."""
    g = GGUFFile(_moe_file(arch))
    plan = plan_upload(g)
    total = g.size - g.data_offset
    assert plan is not None and plan.total == total
    pieces = list(plan.base)
    for il, tensors in plan.experts.items():
        assert plan.n_expert[il] == g.tensor(f"blk.{il}.ffn_down_exps.weight").shape[2]
        for t in tensors:
            pieces += [(t.offset + e * t.stride, t.stride) for e in range(plan.n_expert[il])]
    pieces.sort()
    assert pieces[0][0] == 0 and sum(n for _, n in pieces) == total
    assert all(a + n == b for (a, n), (b, _) in zip(pieces, pieces[1:])), "gaps or overlaps"
    moe_layers = {il for il in range(g.arch_get("block_count")) if f"blk.{il}.ffn_gate_inp.weight" in g.tensors}
    assert set(plan.experts) == moe_layers
    assert plan_upload(GGUFFile(_dense_file())) is None


def _dense_file():
    from fixtures import make_fixture

    return str(make_fixture("qwen3", "q4_k_m").gguf)


def _stream(path, threads=3, chunk=8192, delay=0.0):
    g = GGUFFile(path)
    plan = plan_upload(g)
    dev = _Dev(plan.total, delay)
    ws = WeightStream(dev, StagingRing(dev, threads, chunk), path, g.data_offset, dev.base, plan)
    with open(path, "rb") as f:
        f.seek(g.data_offset)
        data = f.read()
    return ws, dev, plan, data


def _expert_ranges(plan, il, e):
    return [(t.offset + e * t.stride, t.stride) for t in plan.experts[il]]


def _landed(dev, data, ranges):
    return all(bytes(dev.mem[a:a + n]) == data[a:a + n] for a, n in ranges)


def _untouched(dev, ranges):
    return all(not any(dev.mem[a:a + n]) for a, n in ranges)


@pytest.mark.parametrize("threads,chunk", [(1, 4096), (3, 8192), (8, 1 << 20)])
def test_base_first_then_the_asked_experts_then_the_rest(threads, chunk):
    ws, dev, plan, data = _stream(_moe_file("qwen3moe"), threads, chunk)
    ws.load_base()
    assert _landed(dev, data, plan.base)
    layers = sorted(plan.experts)
    every = [(il, e) for il in layers for e in range(plan.n_expert[il])]
    assert all(_untouched(dev, _expert_ranges(plan, il, e)) for il, e in every)  # nothing else before a forward asks
    assert not ws.complete
    ws.ensure(layers[-1], {3, 1, 99, -1})  # ids out of range are ignored
    asked = {(layers[-1], 1), (layers[-1], 3)}
    for il, e in every:
        r = _expert_ranges(plan, il, e)
        assert _landed(dev, data, r) if (il, e) in asked else _untouched(dev, r), (il, e)
    ws.forward_done()  # the first forward is through: the rest goes up behind it
    ws.wait_all()
    assert ws.complete and bytes(dev.mem) == data
    s = ws.stats
    assert s["resident_bytes_at_release"] == s["base_bytes"] + 2 * plan.expert_bytes(layers[-1])
    # the record says what the first forward waited for: one ask, its two experts' bytes
    assert s["demand_waits"] == 1 and s["demand_bytes"] == 2 * plan.expert_bytes(layers[-1]) and s["demand_wait_ms"] > 0
    assert s["base_bytes"] + s["expert_bytes"] == plan.total and s["all_resident_ms"] >= s["base_upload_ms"]
    ws.ensure(layers[0], {0})  # a no-op once everything is there
    for t in ws._threads:
        t.join(5)
    assert not any(t.is_alive() for t in ws._threads), "the workers end when every expert is resident"


@pytest.mark.parametrize("packing", ["1", "0"])
def test_small_experts_go_up_in_packs_that_land_every_byte_in_place(tmp_path, monkeypatch, packing):
    """Experts of odd sizes (not multiples of 16, so no piece offset or size is aligned) asked a
    few per layer: with packing, several go up in one staging buffer and the scatter kernel (its
    reference here) puts each in place; either way the device ends byte-equal to the file, and
    nothing lands that was not asked before the release."""
    import random

    monkeypatch.setenv("REFLEX_UPLOAD_PACK", packing)
    strides, n_exp, base = (1000, 1234, 777), 16, 5003
    experts, at = {}, base
    for il in range(3):
        experts[il] = []
        for st in strides:
            experts[il].append(ExpertTensor(at, st))
            at += st * n_exp
    total = at + 333
    data = os.urandom(total)
    path = tmp_path / "w.bin"
    path.write_bytes(b"\0" * 48 + data)  # the weights region starts at file offset 48
    plan = UploadPlan([(0, base), (at, 333)], experts, {il: n_exp for il in experts}, total)
    dev = _Dev(total)
    ws = WeightStream(dev, StagingRing(dev, 2, 8192), str(path), 48, dev.base, plan)
    ws.load_base()
    rng = random.Random(7)
    asked = {il: rng.sample(range(n_exp), 5) for il in experts}
    for il, es in asked.items():
        ws.ensure(il, es)
        for e in range(n_exp):
            r = _expert_ranges(plan, il, e)
            assert _landed(dev, data, r) if e in es else _untouched(dev, r), (il, e)
    assert (max(dev.packs, default=0) > 1) == (packing == "1"), dev.packs
    ws.forward_done()
    ws.wait_all()
    assert bytes(dev.mem) == data and ws.stats["upload_packs"] == (packing == "1")
    # the packs' scratch: one allocation, a staging ring's worth, made with the stream (not by a worker)
    assert [len(buf) for buf in dev.scratch.values()] == ([8192 * 2 * 2] if packing == "1" else [])


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen35moe", "deepseek"])
def test_the_base_parts_are_the_base_by_the_block_that_reads_it(arch):
    """plan.base_parts (REFLEX_STREAM_BASE): the embedding's part first, then each block's, then
    the LM head's; together exactly the base's bytes; every tensor inside its reader's part."""
    g = GGUFFile(_moe_file(arch))
    plan = plan_upload(g)
    who = [w for w, _ in plan.base_parts]
    blocks = [w for w in who if isinstance(w, int)]
    assert who == [None] + blocks + ["head"] and blocks == sorted(blocks) and blocks[0] == 0

    def merged(ranges):
        out = []
        for off, n in sorted(ranges):
            if out and out[-1][1] == off:
                out[-1][1] = off + n
            else:
                assert not out or out[-1][1] < off, "overlapping ranges"
                out.append([off, off + n])
        return out

    assert merged(r for _, rs in plan.base_parts for r in rs) == merged(plan.base)  # the same bytes, none twice
    experts = {t.offset for ts in plan.experts.values() for t in ts}
    for name, ti in g.tensors.items():
        off = ti.offset - g.data_offset
        if off in experts:
            continue
        w = int(name.split(".")[1]) if name.startswith("blk.") else "head" if name in (
            "output.weight", "output_norm.weight") else None
        assert any(a <= off and off + ti.nbytes <= a + n for a, n in dict(plan.base_parts)[w]), name


def test_with_the_base_streamed_each_block_waits_for_its_own_part(monkeypatch):
    """REFLEX_STREAM_BASE=1: load_base() returns once the first part is up; ensure_base(i) returns
    with block i's part on the device; the rest of the base goes up before any expert nobody asked
    for; everything lands. Without the switch, ensure_base is a no-op and load_base waits for all."""
    monkeypatch.setenv("REFLEX_STREAM_BASE", "1")
    ws, dev, plan, data = _stream(_moe_file("qwen35moe"), threads=2, chunk=4096, delay=0.0005)
    ws.load_base()
    parts = dict(plan.base_parts)
    assert _landed(dev, data, parts[None]) and ws.stats["base_streamed"]
    assert ws.stats["base_loaded_bytes"] == sum(n for _, n in parts[None]) < ws.stats["base_bytes"]
    for w in [w for w in parts if isinstance(w, int)][::-1] + ["head"]:  # the last block first: it jumps the queue
        ws.ensure_base(w)
        assert _landed(dev, data, parts[w]), w
    il = sorted(plan.experts)[0]
    every = [(il, e) for il in plan.experts for e in range(plan.n_expert[il])]
    assert all(_untouched(dev, _expert_ranges(plan, i, e)) for i, e in every)  # no expert before it is asked
    ws.ensure(il, {1})
    ws.forward_done()
    ws.wait_all()
    assert bytes(dev.mem) == data and ws.stats["base_wait_ms"] > 0  # the record says what the blocks waited

    monkeypatch.setenv("REFLEX_STREAM_BASE", "0")
    ws, dev, plan, data = _stream(_moe_file("qwen35moe"), threads=2, chunk=4096)
    ws.load_base()
    assert _landed(dev, data, plan.base) and not ws.stats["base_streamed"]
    ws.ensure_base(0)
    ws.ensure_base("head")
    ws.wait_all()
    assert bytes(dev.mem) == data


def test_a_waiter_is_woken_when_its_last_tag_lands_not_at_every_chunk():
    """ensure() of many experts cut into many small chunks wakes its caller about once: a wake per
    landed chunk made eight workers and the caller contend for the GIL (demand 9 GB/s on the
    Qwen3.5-35B-A3B's 0.59 MB experts, results/2026-12-02-h200-s9)."""
    ws, dev, plan, data = _stream(_moe_file("qwen35moe"), threads=4, chunk=4096)
    ws.load_base()
    wakes = []
    real = ws._landed_cv.notify_all
    ws._landed_cv.notify_all = lambda: (wakes.append(1), real())[1]
    il = sorted(plan.experts)[-1]
    asked = set(range(0, plan.n_expert[il], 2))
    ws.ensure(il, asked)
    chunks = sum(-(-t.stride // 4096) for t in plan.experts[il]) * len(asked)
    assert chunks >= 20 and len(wakes) <= 2, (chunks, len(wakes))
    assert all(_landed(dev, data, _expert_ranges(plan, il, e)) for e in asked)
    ws.wait_all()
    assert bytes(dev.mem) == data


def test_a_burst_is_shared_out_among_the_workers_and_landed_once_per_share():
    """ensure() of many chunks: each worker takes an even share at once and lands it under the lock
    once (per-pack taking and landing held the Qwen3.5 bursts to 10 GB/s with no device copy,
    results/2026-12-02-h200-s11)."""
    ws, dev, plan, data = _stream(_moe_file("qwen35moe"), threads=4, chunk=4096)
    ws.load_base()
    lands, real = [], ws._land
    ws._land = lambda chunks: (lands.append(len(chunks)), real(chunks))[1]
    il = sorted(plan.experts)[-1]
    asked = set(range(0, plan.n_expert[il], 2))
    ws.ensure(il, asked)
    chunks = sum(-(-t.stride // 4096) for t in plan.experts[il]) * len(asked)
    assert chunks >= 20 and sum(lands) == chunks and len(lands) <= 4, (chunks, lands)
    assert all(_landed(dev, data, _expert_ranges(plan, il, e)) for e in asked)
    ws.wait_all()
    assert bytes(dev.mem) == data


def test_an_expert_asked_for_jumps_the_background_queue():
    """While the background upload works through layer 0, a forward's ask for the last layer's
    last expert is served first: it lands while most of the rest is still to come."""
    ws, dev, plan, data = _stream(_moe_file("qwen35moe"), threads=2, chunk=16384)
    ws.load_base()
    dev.delay = 0.002  # the experts' copies are slow
    ws.release()
    time.sleep(0.02)
    last = max(plan.experts)
    tag_ranges = _expert_ranges(plan, last, plan.n_expert[last] - 1)
    ws.ensure(last, {plan.n_expert[last] - 1})
    experts_landed = ws.landed_bytes - ws.stats["base_bytes"]
    assert _landed(dev, data, tag_ranges) and not ws.complete
    assert experts_landed < ws.stats["expert_bytes"] / 2, (experts_landed, ws.stats)  # not behind the whole queue
    ws.wait_all()
    assert bytes(dev.mem) == data


def test_an_expert_of_the_layer_being_filled_in_goes_first():
    """The background has queued a whole layer's chunks; an ask for that layer's last expert
    takes its chunks out of that queue and ahead of the rest."""
    ws, dev, plan, data = _stream(_moe_file("qwen35moe"), threads=2, chunk=4096)
    ws.load_base()
    dev.delay = 0.002  # the experts' copies are slow
    ws.release()
    first = min(plan.experts)
    deadline = time.monotonic() + 10
    while ws.landed_bytes == ws.stats["base_bytes"] and time.monotonic() < deadline:
        time.sleep(0.001)
    e = plan.n_expert[first] - 1
    ws.ensure(first, {e})
    assert _landed(dev, data, _expert_ranges(plan, first, e))
    layer_done = sum(_landed(dev, data, _expert_ranges(plan, first, x)) for x in range(plan.n_expert[first]))
    assert layer_done <= plan.n_expert[first] // 2, layer_done  # not after the layer's other experts
    ws.wait_all()
    assert bytes(dev.mem) == data


def test_many_threads_asking_at_once_all_get_their_experts():
    ws, dev, plan, data = _stream(_moe_file("deepseek"), threads=4, chunk=4096)
    ws.load_base()
    errors = []

    def ask(il, e):
        try:
            ws.ensure(il, {e, (e + 3) % plan.n_expert[il]})
            assert _landed(dev, data, _expert_ranges(plan, il, e))
        except BaseException as ex:  # noqa: BLE001 - reported below
            errors.append(ex)

    threads = [threading.Thread(target=ask, args=(il, e)) for il in plan.experts for e in range(0, plan.n_expert[il], 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "an ensure() never returned"
    assert not errors, errors
    ws.wait_all()
    assert bytes(dev.mem) == data


def test_with_nobody_asking_the_rest_starts_after_the_idle_time(monkeypatch):
    """No forward asks (a server waiting for its first request): the background upload starts
    IDLE_RELEASE_S after the base landed, not before, however long the base took."""
    monkeypatch.setattr(residency, "IDLE_RELEASE_S", 0.4)
    ws, dev, plan, data = _stream(_moe_file("qwen3moe"), threads=2, chunk=1 << 16, delay=0.003)
    t0 = time.perf_counter()
    ws.load_base()
    assert time.perf_counter() - t0 > 0.4  # the base alone took longer than the idle time
    time.sleep(0.2)
    assert ws.landed_bytes == ws.stats["base_bytes"] and "released_after_ms" not in ws.stats
    deadline = time.monotonic() + 30
    while not ws.complete and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ws.complete and bytes(dev.mem) == data
    assert ws.stats["released_after_ms"] >= ws.stats["base_upload_ms"] + 0.4 * 1000 * 0.9


def test_a_short_file_is_a_model_file_error_for_whoever_waits(tmp_path):
    path = tmp_path / "w.bin"
    path.write_bytes(os.urandom(2000))
    plan = UploadPlan([(0, 1000)], {0: [ExpertTensor(1000, 500)]}, {0: 4}, 3000)  # experts 2 and 3 are past the end
    dev = _Dev(3000)
    ws = WeightStream(dev, StagingRing(dev, 2, 256), str(path), 0, dev.base, plan)
    ws.load_base()
    ws.ensure(0, {0, 1})
    with pytest.raises(ModelFileError, match="shrank"):
        ws.ensure(0, {3})
    with pytest.raises(ModelFileError, match="shrank"):
        ws.wait_all()
    with pytest.raises(ModelFileError, match="shrank"):  # from now on, even for experts that are there
        ws.ensure(0, {0})
    assert "shrank" in ws.stats["upload_error"]


def test_a_cold_page_cache_reads_only_the_base_of_an_on_demand_file_ahead(monkeypatch):
    """loader._prefetch: with experts on demand the read-ahead is the base's ranges (the upload
    reads each expert when it is asked for); with them off, or a dense file, the whole file."""
    from reflex_runtime import loader
    from reflex_runtime.modelfile import pagecache

    calls = []
    monkeypatch.setattr(pagecache, "prefetch", lambda path, ranges=None, **kw: calls.append(ranges))
    g = GGUFFile(_moe_file("qwen3moe"))
    loader._prefetch(g)
    assert calls[-1] == [(g.data_offset + a, n) for a, n in plan_upload(g).base]
    monkeypatch.setenv("REFLEX_EXPERTS_ON_DEMAND", "0")
    loader._prefetch(g)
    loader._prefetch(GGUFFile(_dense_file()))
    assert calls[1:] == [None, None]


def test_prefetch_reads_the_ranges_it_is_given_in_chunks(tmp_path, monkeypatch):
    from reflex_runtime.modelfile import pagecache

    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(50_000))
    seen, real = [], os.preadv
    monkeypatch.setattr(pagecache.os, "preadv", lambda fd, bufs, off: seen.append((off, len(bufs[0]))) or real(fd, bufs, off))
    for t in pagecache.prefetch(str(path), threads=3, chunk=4096, ranges=[(100, 10_000), (30_000, 5000)]):
        t.join(10)
    want = [(100 + c, min(4096, 10_000 - c)) for c in range(0, 10_000, 4096)] + [(30_000, 4096), (34_096, 904)]
    assert sorted(seen) == sorted(want)
    seen.clear()
    for t in pagecache.prefetch(str(path), threads=2, chunk=16_384):
        t.join(10)
    assert sorted(seen) == [(0, 16_384), (16_384, 16_384), (32_768, 16_384), (49_152, 848)]


def test_the_demand_benchmark_times_each_layers_burst_and_lands_every_byte(monkeypatch):
    """scripts/bench_upload.py --demand on the fake device: the base, `asked` experts of each MoE
    layer (timed), then the rest; the device ends with the whole tensor data."""
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
    import bench_upload

    path = _moe_file("qwen35moe")
    g = GGUFFile(path)
    plan = plan_upload(g)
    dev = _Dev(plan.total)
    row = bench_upload.demand_rate(dev, g, dev.base, threads=3, chunk=8192, buffers=2, asked=2)
    with open(path, "rb") as f:
        f.seek(g.data_offset)
        assert bytes(dev.mem) == f.read()
    assert row["layers"] == len(plan.experts) and row["asked"] == 2
    assert row["demand_bytes"] == sum(2 * plan.expert_bytes(il) for il in plan.experts)
    assert row["demand_ms"] > 0 and row["layer_ms_max"] >= row["layer_ms_p50"] > 0 and row["all_resident_ms"] > 0
    assert row["reads_ms"] > 0 and row["reads_gb_s"] > 0, "the same bursts read alone, no device copy"
    spent = row["workers_ms_per_layer"]  # the workers' time during the bursts: reads and driver calls timed
    assert spent["read"] > 0 and spent["htod"] > 0 and {"sync", "other"} <= set(spent)  # the fake's sync rounds to 0 ms
    assert not dev.pinned, "the staging buffers are given back"
    dry = _Dev(plan.total)
    row = bench_upload.demand_rate(bench_upload._NoCopies(dry), g, dry.base, threads=2, chunk=8192, buffers=2, asked=2)
    assert row["demand_bytes"] > 0 and not any(bytes(dry.mem)) and not dry.packs, "--copies none: nothing reaches the device"
    blank = _Dev(plan.total)
    with bench_upload._no_reads(True):
        row = bench_upload.demand_rate(blank, g, blank.base, threads=2, chunk=8192, buffers=2, asked=2)
    assert row["demand_bytes"] > 0 and not any(bytes(blank.mem)), "--copies noread: the file is never read"
    from reflex_runtime.gpu import upload
    assert residency.read_chunk is upload.read_chunk, "the reads are back after --copies noread"


def test_the_demand_benchmark_refuses_a_dense_file_in_one_line():
    """bench_upload.py --demand on a file with no routed experts: one line, exit 2, before any GPU."""
    import subprocess
    import sys

    from fixtures import make_fixture

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dense = str(make_fixture("qwen3", "q8_0").gguf)
    r = subprocess.run([sys.executable, os.path.join(root, "scripts", "bench_upload.py"), dense, "--demand", "4"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "has no routed experts" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = subprocess.run([sys.executable, os.path.join(root, "scripts", "bench_upload.py"), dense, "--demand", "-1"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--demand" in r.stderr and "Traceback" not in r.stderr
