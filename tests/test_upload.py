"""gpu/upload.py on the CPU: the cold path's copy of a GGUF's tensor data to the device, through
a fake device whose "device memory" is a host buffer and whose async copies run at once
(tests/fake_device.py HostMemoryDevice)."""

import ctypes
import os

import pytest

from fake_device import HostMemoryDevice
from reflex_runtime.errors import ModelFileError
from reflex_runtime.gpu.upload import MappedFile, StagingRing, upload_file_range, upload_mapped


@pytest.mark.parametrize("threads,chunk,buffers", [(1, 4096, 2), (3, 1000, 2), (4, 4096, 3), (8, 65536, 4)])
def test_every_byte_lands_where_the_file_has_it(tmp_path, threads, chunk, buffers):
    data = os.urandom(300_001)
    path = tmp_path / "w.bin"
    path.write_bytes(data)
    off, n = 777, len(data) - 777 - 5  # a range of the file: not whole chunks
    dev = HostMemoryDevice(n + 64)
    ring = StagingRing(dev, threads, chunk, buffers)
    upload_file_range(dev, ring, str(path), off, n, dev.base + 64)
    assert bytes(dev.mem[64:64 + n]) == data[off:off + n]
    used = [b for b in ring.buffers if b is not None]
    assert used and all(len(b) == buffers for b in used)
    assert len(dev.pinned) == len(used) * buffers
    ring.free(dev)
    assert not dev.pinned and ring.buffers == [None] * threads


@pytest.mark.parametrize("threads,chunk,buffers", [(1, 4096, 2), (3, 3 << 20, 2)])
def test_huge_page_staging_lands_every_byte_and_gives_its_regions_back(tmp_path, threads, chunk, buffers):
    """pin="thp" (REFLEX_UPLOAD_PIN=thp): one registered region per thread, on 2 MB boundaries,
    the same bytes landed; free() unregisters and unmaps them."""
    data = os.urandom(5_000_000)
    path = tmp_path / "w.bin"
    path.write_bytes(data)
    dev = HostMemoryDevice(len(data))
    ring = StagingRing(dev, threads, chunk, buffers, pin="thp")
    upload_file_range(dev, ring, str(path), 0, len(data), dev.base)
    assert bytes(dev.mem) == data and not dev.pinned
    used = [r for r in ring._regions if r is not None]
    assert len(dev.registered) == len(used) >= 1
    assert all(p % (2 << 20) == 0 and n >= chunk * buffers for p, n in dev.registered.items())
    ring.free(dev)
    assert not dev.registered and ring.buffers == [None] * threads


def test_the_pinning_mode_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("REFLEX_UPLOAD_PIN", "thp")
    assert StagingRing(None, 2).pin == "thp"
    monkeypatch.setenv("REFLEX_UPLOAD_PIN", "what")
    assert StagingRing(None, 2).pin == "alloc"


def test_a_file_shorter_than_its_directory_says_is_a_model_file_error(tmp_path):
    path = tmp_path / "w.bin"
    path.write_bytes(b"x" * 5000)
    dev = HostMemoryDevice(10_000)
    with pytest.raises(ModelFileError, match="shrank"):
        upload_file_range(dev, StagingRing(dev, 2, 1024), str(path), 0, 8000, dev.base)


def test_the_ring_takes_its_size_from_the_environment(monkeypatch):
    """REFLEX_UPLOAD_THREADS / REFLEX_UPLOAD_CHUNK_MB for measuring other rings on the cold path;
    nonsense falls back to the defaults."""
    from reflex_runtime.gpu.upload import CHUNK, CHUNK_ON_DEMAND, default_chunk, default_threads

    assert default_chunk() == CHUNK < default_chunk(on_demand=True) == CHUNK_ON_DEMAND  # bigger packs of experts

    monkeypatch.setenv("REFLEX_UPLOAD_THREADS", "16")
    monkeypatch.setenv("REFLEX_UPLOAD_CHUNK_MB", "8")
    assert (default_threads(), default_chunk(), default_chunk(on_demand=True)) == (16, 8 << 20, 8 << 20)
    for bad in ("0", "-3", "x", "", "1000"):
        monkeypatch.setenv("REFLEX_UPLOAD_THREADS", bad)
        monkeypatch.setenv("REFLEX_UPLOAD_CHUNK_MB", bad)
        assert 1 <= default_threads() <= 64 and default_chunk() == CHUNK and default_chunk(True) == CHUNK_ON_DEMAND


@pytest.mark.parametrize("threads,piece", [(1, 1 << 20), (3, 4096), (8, 64 << 20)])
def test_the_mapped_upload_lands_every_byte_and_unmaps(tmp_path, threads, piece):
    """REFLEX_UPLOAD_MAPPED=1's copy (gpu/upload.py MappedFile, upload_mapped): straight from a
    shared read-only mapping of the file, each thread one share in pieces; every byte of the range
    lands where the file has it, and close() unmaps (twice is harmless)."""
    data = os.urandom(5_000_000)
    path = tmp_path / "w.bin"
    path.write_bytes(data)
    off, n = 4097, len(data) - 4097 - 3  # the data region's offset is not page-aligned
    dev = HostMemoryDevice(n + 64)
    m = MappedFile(str(path), off + n)
    copies = []
    htod = dev.htod
    dev.htod = lambda dst, src, k, stream: (copies.append((dst - dev.base - 64, k)), htod(dst, src, k, stream))
    upload_mapped(dev, m, off, n, dev.base + 64, threads, piece=piece)
    assert bytes(dev.mem[64:64 + n]) == data[off:off + n]
    spans = sorted(copies)
    assert spans[0][0] == 0 and all(a + k == b for (a, k), (b, _) in zip(spans, spans[1:]))  # no gap, no overlap
    assert sum(k for _, k in spans) == n and max(k for _, k in spans) <= piece
    assert not dev.pinned  # nothing staged
    m.close()
    assert m.addr == 0
    m.close()


def test_a_mapped_file_shorter_than_its_directory_says_is_a_model_file_error(tmp_path):
    path = tmp_path / "w.bin"
    path.write_bytes(b"x" * 5000)
    with pytest.raises(ModelFileError, match="shrank"):
        MappedFile(str(path), 8000)


@pytest.mark.parametrize("mode", ["1", "0", "1-no-mmap"])
def test_the_runner_uploads_from_the_mapping_when_asked(monkeypatch, mode):
    """The runner's load (gpu/runner.py) takes the mapped upload for a dense file with
    REFLEX_UPLOAD_MAPPED=1, says so in its stats and its timeline, and unmaps after; where the file
    cannot be mapped it takes the staging ring; either way the device copies cover the weights
    region once, with no gap and no overlap."""
    monkeypatch.syspath_prepend(os.path.dirname(__file__))
    from fake_device import FakeBoot, FakeDevice
    from reflex_runtime.families import gpu_model_class, read_config
    from reflex_runtime.gpu import upload
    from reflex_runtime.gpu.runner import CudaRunner
    from reflex_runtime.measure.coldstart import Timeline
    from reflex_runtime.modelfile.embedded import embedded_model_path
    from reflex_runtime.modelfile.gguf_file import GGUFFile

    closed = []
    real_close = upload.MappedFile.close
    monkeypatch.setattr(upload.MappedFile, "close", lambda self: (closed.append(self.addr), real_close(self)))
    monkeypatch.setenv("REFLEX_UPLOAD_MAPPED", mode[0])
    if mode == "1-no-mmap":
        def refuse(self, path, length):
            raise OSError(12, "could not map")

        monkeypatch.setattr(upload.MappedFile, "__init__", refuse)
    g = GGUFFile(embedded_model_path())
    cfg = read_config(g)
    dev = FakeDevice({})
    tl = Timeline()
    r = CudaRunner.start(FakeBoot(dev), g, cfg, tl, gpu_model_class(cfg), max_context=64)
    r.wait_ready()
    mapped = mode == "1"
    assert r.upload_stats["upload_mode"] == ("mapped" if mapped else "staged")
    assert ("weights_map" in tl.spans) == mapped
    dst = dev._ranges[0][0] + r.model.arena.offsets["weights"]
    spans = sorted((p - dst, n) for what, p, n in dev.copies if what == "htod" and dst <= p < dst + r.model.weights_bytes)
    assert spans[0][0] == 0 and all(a + n == b for (a, n), (b, _) in zip(spans, spans[1:]))
    assert spans[-1][0] + spans[-1][1] == r.model.weights_bytes
    assert len(closed) == int(mapped) and all(closed)
    g.close()



def test_bench_upload_gil_reports_both_modes(tmp_path):
    """scripts/bench_upload_gil.py: each mode beside the tokenizer and after it, in JSON; a bad mode
    is a one-line error."""
    import json
    import subprocess
    import sys

    from reflex_runtime.modelfile.embedded import embedded_model_path

    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "bench_upload_gil.py")
    out = tmp_path / "gil.json"
    r = subprocess.run([sys.executable, script, embedded_model_path(), "--rounds", "1", "--threads", "3", "--out",
                        str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    assert set(d["median"]) == {"staged concurrent", "staged serial", "mapped concurrent", "mapped serial"}
    for key, row in d["median"].items():
        assert row["tokenizer_ms"] > 0 and row["upload_ms"] > 0 and row["both_done_ms"] >= row["tokenizer_ms"], key
        assert ("map_ms" in row) == key.startswith("mapped")
    bad = subprocess.run([sys.executable, script, embedded_model_path(), "--modes", "staged,fast"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--modes" in bad.stderr
