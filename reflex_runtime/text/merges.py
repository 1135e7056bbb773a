"""The two merge loops: byte-level BPE (by merge rank) and SentencePiece BPE (by piece score).

Both repeatedly join one adjacent pair of symbols until no pair qualifies, and break ties by the
leftmost pair, as llama.cpp, Hugging Face tokenizers and sentencepiece do. Pure functions over
lists of strings; the tokenizer maps the resulting pieces to ids.
"""

from __future__ import annotations

import heapq
from typing import Callable

SHORT_WORD = 24  # BPE words up to this many symbols use the quadratic scan; longer ones a heap


def bpe_merge(symbols: list[str], ranks: dict[str, int]) -> list[str]:
    """Merge by rank, lowest first. `ranks` maps "left right" to a rank. Modifies `symbols`."""
    if len(symbols) <= SHORT_WORD:
        return _bpe_scan(symbols, ranks)
    return _bpe_heap(symbols, ranks)


def _bpe_scan(symbols: list[str], ranks: dict[str, int]) -> list[str]:
    # Cheapest for the short words that make up nearly all text.
    while len(symbols) > 1:
        best_rank = None
        best = -1
        for i in range(len(symbols) - 1):
            rank = ranks.get(symbols[i] + " " + symbols[i + 1])
            if rank is not None and (best_rank is None or rank < best_rank):
                best_rank, best = rank, i
        if best < 0:
            break
        symbols[best:best + 2] = [symbols[best] + symbols[best + 1]]
    return symbols


def _bpe_heap(symbols: list[str], ranks: dict[str, int]) -> list[str]:
    """The same merges with a heap of (rank, left index) and a linked list: O(n log n), for long
    words where the scan would be quadratic."""
    n = len(symbols)
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    prv = list(range(-1, n - 1))
    heap = []
    for i in range(n - 1):
        rank = ranks.get(symbols[i] + " " + symbols[i + 1])
        if rank is not None:
            heap.append((rank, i, symbols[i], symbols[i + 1]))
    heapq.heapify(heap)

    def push(left: int, right: int) -> None:
        rank = ranks.get(symbols[left] + " " + symbols[right])
        if rank is not None:
            heapq.heappush(heap, (rank, left, symbols[left], symbols[right]))

    while heap:
        _, left, a, b = heapq.heappop(heap)
        right = nxt[left]
        if right < 0 or symbols[left] != a or symbols[right] != b:
            continue  # stale: a neighbour merged since this pair was queued
        symbols[left] = a + b
        symbols[right] = ""
        after = nxt[left] = nxt[right]
        if after >= 0:
            prv[after] = left
            push(left, after)
        if prv[left] >= 0:
            push(prv[left], left)
    return [s for s in symbols if s]


def spm_merge(symbols: list[str], pair_score: Callable[[str, str], float | None]) -> list[str]:
    """Merge by score, highest first. pair_score(left, right) is the score of the piece left+right,
    or None when that text may not be formed. Modifies `symbols`."""
    n = len(symbols)
    if n < 2:
        return symbols
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    prv = list(range(-1, n - 1))
    heap: list = []

    def push(left: int, right: int) -> None:
        score = pair_score(symbols[left], symbols[right])
        if score is not None:
            heapq.heappush(heap, (-score, left, len(symbols[left]) + len(symbols[right]), right))

    for i in range(n - 1):
        push(i, i + 1)
    while heap:
        _, left, size, right = heapq.heappop(heap)
        a, b = symbols[left], symbols[right]
        if not a or not b or len(a) + len(b) != size:
            continue  # stale: one side has merged since this pair was queued (symbols only grow)
        symbols[left] = a + b
        symbols[right] = ""
        after = nxt[left] = nxt[right]
        if after >= 0:
            prv[after] = left
            push(left, after)
        if prv[left] >= 0:
            push(prv[left], left)
    return [s for s in symbols if s]
