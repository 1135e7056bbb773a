"""Is the model file in the page cache, and if not, start reading it now.

With a warm cache the weights stream to the GPU at ~13+ GB/s; with a cold one, disk reads
dominate the cold start, so they should begin while CUDA initialises rather than after. mincore()
tells us cheaply which case we are in, so a warm start wastes no CPU on reading the file twice.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading

_PAGE = mmap.PAGESIZE


# mincore() walks the page cache one page at a time (~12 ms per GB of file, measured on the H200
# machine: 400 ms for a 32.5 GB file, on the main thread, and holding the mmap lock that cuInit's
# own mappings wait for). WINDOWS windows of WINDOW_PAGES pages spread over the file say as much.
WINDOWS = 512
WINDOW_PAGES = 16


def resident_fraction(path: str) -> float | None:
    """Fraction of the file's pages in the page cache (None where mincore is unavailable),
    estimated from WINDOWS evenly spaced windows of WINDOW_PAGES pages (every page of a small file)."""
    try:
        size = os.path.getsize(path)
        if size == 0:
            return 1.0
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        # A read-only shared mapping: nothing is charged against the overcommit limit (a private
        # writable one of a 40 GB file is refused on a small machine), and nothing is read.
        with open(path, "rb") as f:
            base = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), 0)
        if base in (None, ctypes.c_void_p(-1).value):
            return None
        try:
            n_pages = (size + _PAGE - 1) // _PAGE
            vec = (ctypes.c_ubyte * min(n_pages, WINDOW_PAGES))()
            resident = counted = 0
            for first, count in sample_windows(n_pages):
                if libc.mincore(base + first * _PAGE, count * _PAGE, vec) != 0:
                    return None
                resident += sum(v & 1 for v in vec[:count])
                counted += count
            return resident / counted
        finally:
            libc.munmap(base, size)
    except (OSError, ValueError, AttributeError):
        return None


def sample_windows(n_pages: int) -> list[tuple[int, int]]:
    """(first page, pages) of the windows resident_fraction() asks mincore about: the whole file
    when it is no more than WINDOWS windows, else WINDOWS evenly spaced ones, the last at the end."""
    if n_pages <= WINDOWS * WINDOW_PAGES:
        return [(a, min(WINDOW_PAGES, n_pages - a)) for a in range(0, n_pages, WINDOW_PAGES)]
    step = (n_pages - WINDOW_PAGES) / (WINDOWS - 1)
    return [(round(i * step), WINDOW_PAGES) for i in range(WINDOWS)]


def prefetch(path: str, threads: int = 4, chunk: int = 8 << 20, ranges=None) -> list[threading.Thread]:
    """Read the whole file (or these (offset, nbytes) ranges of it, in order) on background
    threads (the reads release the GIL) so the page cache fills while the GPU comes up; returns
    the threads (daemons: nobody has to wait for them)."""
    if ranges is None:
        ranges = [(0, os.path.getsize(path))]
    pieces = [(off + c, min(chunk, n - c)) for off, n in ranges for c in range(0, n, chunk)]
    n_chunks = len(pieces)

    def worker(w: int) -> None:
        buf = bytearray(chunk)
        view = memoryview(buf)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return
        try:
            for c in range(w, n_chunks, threads):
                off, n = pieces[c]
                os.preadv(fd, [view[:n]], off)
        except OSError:
            pass
        finally:
            os.close(fd)

    started = []
    for w in range(threads):
        t = threading.Thread(target=worker, args=(w,), name="reflex-prefetch", daemon=True)
        t.start()
        started.append(t)
    return started
