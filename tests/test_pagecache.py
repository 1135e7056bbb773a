"""modelfile/pagecache.resident_fraction: the page-cache check on the cold path samples windows of
a big file instead of walking every page (a 32.5 GB file cost 400 ms on the main thread)."""

import os

from reflex_runtime.modelfile import pagecache


def test_windows_cover_a_small_file_page_by_page():
    n = pagecache.WINDOWS * pagecache.WINDOW_PAGES - 5
    windows = pagecache.sample_windows(n)
    pages = [p for a, c in windows for p in range(a, a + c)]
    assert pages == list(range(n))


def test_windows_of_a_big_file_are_few_spread_and_inside_it():
    n = (32_500 << 20) // 4096  # a 32.5 GB file of 4 KiB pages
    windows = pagecache.sample_windows(n)
    assert len(windows) == pagecache.WINDOWS
    assert windows[0][0] == 0 and windows[-1][0] + windows[-1][1] == n
    assert all(c == pagecache.WINDOW_PAGES and 0 <= a and a + c <= n for a, c in windows)
    starts = [a for a, _ in windows]
    assert starts == sorted(set(starts))  # no window twice
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert max(gaps) - min(gaps) <= 1  # evenly spread


def test_a_file_just_written_is_resident(tmp_path):
    path = tmp_path / "w.bin"
    path.write_bytes(os.urandom(3 << 20))
    assert pagecache.resident_fraction(str(path)) == 1.0


def test_a_sparse_file_counts_only_the_pages_it_has(tmp_path):
    """A 40 GiB file, its first half written nowhere and its head (1/8) written: the windows
    find about an eighth of it resident, and the check does not walk 10 million pages."""
    path = tmp_path / "sparse.bin"
    size = 40 << 30
    head = size // 8
    with open(path, "wb") as f:
        f.truncate(size)
    with open(path, "r+b") as f:  # fill the windows' pages in the head (sparse, not 5 GiB of data)
        page = pagecache._PAGE
        for a, c in pagecache.sample_windows(size // page):
            if (a + c) * page <= head:
                f.seek(a * page)
                f.write(b"\1" * (c * page))
    frac = pagecache.resident_fraction(str(path))
    assert frac is not None and abs(frac - 1 / 8) < 0.01, frac


def test_an_empty_file_is_resident(tmp_path):
    path = tmp_path / "empty.bin"
    path.write_bytes(b"")
    assert pagecache.resident_fraction(str(path)) == 1.0
