"""Copy a byte range of the GGUF file into device memory, straight from the page cache.

The tensor data region of a GGUF is one contiguous, aligned block; we copy it whole, in file
order, so a tensor's device address is `arena + (file offset - data offset)` and no per-tensor
bookkeeping or host-side copy of the weights exists. Reader threads `preadv` chunks into small
pinned buffers (each thread double-buffers) and queue async host-to-device copies on their own
streams; both the reads and the driver calls release the GIL. Pinning costs ~0.44 ms/MB, so
the staging ring stays small and is allocated once, while the context comes up.
"""

from __future__ import annotations

import os
import threading

from ..errors import ModelFileError

CHUNK = 2 << 20
# Experts on demand (gpu/residency.py): a layer's burst of small experts goes up as packs of
# several to a staging buffer, and bigger buffers make fewer packs. On the Qwen3.5-35B-A3B file's
# 0.59 MB experts, 4 MB took its first forward's waits from 212 to 165 ms (first token 888 ->
# 757 ms p50, results/2026-12-02-h200-s11); a dense file keeps 2 MB (half the pinning).
CHUNK_ON_DEMAND = 4 << 20
BUFFERS_PER_THREAD = 2


class StagingRing:
    """Per-thread pinned buffers (double by default), events and streams. Each worker allocates
    its own on first use, so the pinning (~0.44 ms/MB) happens on all threads at once.
    pin: "alloc" (cuMemHostAlloc per buffer) or "thp" (one anonymous region per thread on
    transparent huge pages, registered with cuMemHostRegister: fewer, larger pages to pin, an
    experiment for bigger rings; default REFLEX_UPLOAD_PIN, else "alloc")."""

    def __init__(self, device, n_threads: int, chunk: int = CHUNK, buffers: int = BUFFERS_PER_THREAD,
                 pin: str | None = None):
        self.chunk = chunk
        self.n_threads = n_threads
        self.per_thread = buffers
        self.pin = pin or default_pin()
        self.buffers: list = [None] * n_threads
        self.events: list = [None] * n_threads
        self.streams: list = [None] * n_threads
        self._regions: list = [None] * n_threads

    def ensure(self, device, w: int) -> None:
        if self.buffers[w] is None:
            if self.pin == "thp":
                r = self._regions[w] = HugePageRegion(device, self.chunk * self.per_thread)
                self.buffers[w] = [(r.ptr + i * self.chunk, r.view[i * self.chunk:(i + 1) * self.chunk])
                                   for i in range(self.per_thread)]
            else:
                self.buffers[w] = [device.alloc_pinned(self.chunk) for _ in range(self.per_thread)]
            self.events[w] = [device.event() for _ in range(self.per_thread)]
            self.streams[w] = device.stream()

    def free(self, device) -> None:
        """Give the pinned buffers back (the runner keeps its ring; benchmarks try several)."""
        for w, bufs in enumerate(self.buffers):
            if self._regions[w] is not None:
                for _, view in bufs:
                    view.release()
                self._regions[w].free(device)
                self._regions[w] = None
                continue
            for ptr, _ in bufs or ():
                device.free_pinned(ptr)
        self.buffers = [None] * self.n_threads


class HugePageRegion:
    """Anonymous host memory on 2 MB transparent huge pages (where the kernel gives them), touched
    once and registered with the driver for DMA (cuMemHostRegister)."""

    HUGE = 2 << 20

    def __init__(self, device, nbytes: int):
        import ctypes
        import mmap

        size = -(-nbytes // self.HUGE) * self.HUGE
        self._map = mmap.mmap(-1, size + self.HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        probe = ctypes.c_char.from_buffer(self._map)
        base = ctypes.addressof(probe)
        del probe  # an exported pointer would keep the map from closing
        start = -base % self.HUGE  # the first 2 MB boundary
        if hasattr(mmap, "MADV_HUGEPAGE"):
            self._map.madvise(mmap.MADV_HUGEPAGE, start, size)
        self.ptr, self.size = base + start, size
        ctypes.memset(self.ptr, 0, size)  # fault every page in before the driver pins them
        device.register_host(self.ptr, size)
        self.view = memoryview(self._map)[start:start + nbytes]

    def free(self, device) -> None:
        device.unregister_host(self.ptr)
        self.view.release()
        self._map.close()


def default_pin() -> str:
    return "thp" if os.environ.get("REFLEX_UPLOAD_PIN") == "thp" else "alloc"


def default_threads() -> int:
    """Reader threads: 8 (or the CPUs, if fewer); REFLEX_UPLOAD_THREADS=N to measure others
    (scripts/bench_upload.py found 16 threads x 8 MB faster on the 30B-A3B; pinning their buffers
    costs ~0.5 ms/MB on the cold path)."""
    n = os.environ.get("REFLEX_UPLOAD_THREADS", "")
    return min(int(n), 64) if n.isdigit() and int(n) > 0 else max(1, min(8, (os.cpu_count() or 2)))


def default_chunk(on_demand: bool = False) -> int:
    """Bytes per staging buffer: REFLEX_UPLOAD_CHUNK_MB=N (1..64), else CHUNK_ON_DEMAND for a file
    whose experts go up on demand, else CHUNK."""
    n = os.environ.get("REFLEX_UPLOAD_CHUNK_MB", "")
    return int(n) << 20 if n.isdigit() and 1 <= int(n) <= 64 else CHUNK_ON_DEMAND if on_demand else CHUNK


def read_chunk(fd: int, view, size: int, offset: int, path: str) -> None:
    """file[offset : offset + size] into view[:size] (preadv may return less than asked)."""
    done = 0
    while done < size:
        got = os.preadv(fd, [view[done:size]], offset + done)
        if got <= 0:
            raise ModelFileError(f"model file shrank while loading: {path}")
        done += got


def _run_all(worker, args, errors: list) -> None:
    """worker(a) on a thread of its own for each a, all joined before returning (even when a thread
    fails to start: the caller may then close the file or unmap what they read); then the first error
    a worker appended to `errors`, raised here."""
    started = []
    try:
        for a in args:
            t = threading.Thread(target=worker, args=(a,), daemon=True)
            t.start()
            started.append(t)
    finally:
        for t in started:
            t.join()
    if errors:
        raise errors[0]


def mapped_enabled() -> bool:
    """REFLEX_UPLOAD_MAPPED=1: a dense file's weights go up from a mapping of the file (MappedFile,
    upload_mapped) instead of through the staging ring. Off until a GPU run measures it (s39)."""
    return os.environ.get("REFLEX_UPLOAD_MAPPED") == "1"


class MappedFile:
    """The first `length` bytes of a file, mapped shared and read-only with its page tables filled
    (MAP_POPULATE: from a warm page cache, in the kernel, without the GIL), for upload_mapped. Made
    on the upload thread before the device is up, so the faults are off the cold path. The address
    comes from libc's mmap (a read-only Python mmap gives none); close() unmaps it once the copies
    are done, and nothing reads the file through a mapping after the load (test_truncated_model).
    During the copies it does: a file truncated then (or an I/O error on a page the kernel had to
    read again) is a SIGBUS that kills the process, where the staging ring's preadv gives a
    ModelFileError. That is one reason REFLEX_UPLOAD_MAPPED is opt-in."""

    def __init__(self, path: str, length: int):
        import ctypes
        import mmap

        libc = ctypes.CDLL(None, use_errno=True)  # (ctypes calls drop the GIL)
        libc.mmap.restype, libc.munmap.restype = ctypes.c_void_p, ctypes.c_int
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self._munmap, self.length, self.addr = libc.munmap, length, 0
        fd = os.open(path, os.O_RDONLY)
        try:
            if os.fstat(fd).st_size < length:
                raise ModelFileError(f"model file shrank while loading: {path}")
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            addr = libc.mmap(None, length, mmap.PROT_READ, flags, fd, 0)
        finally:
            os.close(fd)  # (the mapping keeps the file)
        if addr is None or addr == ctypes.c_void_p(-1).value:  # (the runner then takes the staging ring)
            raise OSError(ctypes.get_errno(), f"could not map {path}: {os.strerror(ctypes.get_errno())}")
        self.addr = addr

    def close(self) -> None:
        if self.addr:
            self._munmap(self.addr, self.length)
            self.addr = 0


def upload_mapped(device, mapped: MappedFile, file_offset: int, nbytes: int, dst: int, n_threads: int,
                  piece: int = 64 << 20) -> None:
    """Copy mapped[file_offset : file_offset + nbytes] to device address dst; returns when done.
    Each thread copies one contiguous share in pieces of `piece` bytes on its own stream: from
    pageable memory the driver stages the bytes itself, so a thread makes a few driver calls (each
    drops the GIL) where the staging ring makes ~5 Python steps per 2 MB chunk, and those steps
    contend with the main thread's tokenizer for the GIL on the cold path."""
    if nbytes <= 0:
        return
    share = -(-nbytes // n_threads)
    share = -(-share // CHUNK) * CHUNK  # whole chunks a thread
    errors: list[BaseException] = []

    def worker(start: int) -> None:
        try:
            device.make_current()
            stream = device.stream()
            end = min(nbytes, start + share)
            for off in range(start, end, piece):
                device.htod(dst + off, mapped.addr + file_offset + off, min(piece, end - off), stream)
            device.sync(stream)
        except BaseException as e:  # surfaced on the calling thread
            errors.append(e)

    _run_all(worker, range(0, nbytes, share), errors)


def upload_file_range(device, ring: StagingRing, path: str, file_offset: int, nbytes: int, dst: int) -> None:
    """Copy file[file_offset : file_offset + nbytes] to device address dst; returns when done."""
    if nbytes <= 0:
        return
    fd = os.open(path, os.O_RDONLY)
    n_chunks = (nbytes + ring.chunk - 1) // ring.chunk
    errors: list[BaseException] = []

    def worker(w: int) -> None:
        try:
            device.make_current()
            ring.ensure(device, w)
            stream = ring.streams[w]
            used = [False] * ring.per_thread
            k = 0
            for c in range(w, n_chunks, ring.n_threads):
                b = k % ring.per_thread
                ptr, view = ring.buffers[w][b]
                if used[b]:
                    device.wait_event(ring.events[w][b])  # the copy out of this buffer is done
                start = c * ring.chunk
                size = min(ring.chunk, nbytes - start)
                read_chunk(fd, view, size, file_offset + start, path)
                device.htod(dst + start, ptr, size, stream)
                device.record(ring.events[w][b], stream)
                used[b] = True
                k += 1
            device.sync(stream)
        except BaseException as e:  # surfaced on the calling thread
            errors.append(e)

    try:
        _run_all(worker, range(min(ring.n_threads, n_chunks)), errors)
    finally:
        os.close(fd)
