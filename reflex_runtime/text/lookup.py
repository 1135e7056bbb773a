"""The tokenizer's lookup tables (token text -> id, merge text -> rank) in the two forms it uses.

A dict costs a hash and an insert per entry: 0.1-0.2 s of GIL-holding work on a cold start for a
150-250k vocabulary, while CUDA's context and the weight upload threads need the GIL. A
SortedLookup builds nothing: it bisects the token texts through an order the model index saved
(modelcache.py), ~2-6 us a lookup against ~0.1-0.25 for a dict. The cold start encodes its first
prompts with it; the tokenizer builds the dicts once it has encoded enough text for them to pay
off (tokenizer.DICTS_AFTER_CHARS).

Both forms keep llama.cpp's rule for a repeated key: a token text maps to its last id, a merge to
its first rank.
"""

from __future__ import annotations

import array
from bisect import bisect_left
from typing import Sequence

SLICE = 8192  # items per C call in the builders below: another thread waits at most ~1 ms for the GIL


def sliced_dict(keys: Sequence, values: Sequence) -> dict:
    """dict(zip(keys, values)), later duplicates winning, built a slice at a time: one call over a
    248k-token vocabulary holds the GIL for ~0.1 s."""
    out: dict = {}
    for i in range(0, len(keys), SLICE):
        out.update(zip(keys[i:i + SLICE], values[i:i + SLICE]))
    return out


def last_wins(keys: Sequence[str]) -> dict:
    """key -> its last index (token ids)."""
    return sliced_dict(keys, range(len(keys)))


def first_wins(keys: Sequence[str]) -> dict:
    """key -> its first index (merge ranks): built back to front."""
    n = len(keys)
    return sliced_dict(keys[::-1], range(n - 1, -1, -1))


def sorted_order(keys: Sequence[str], last: bool) -> bytes:
    """The indices of `keys` in key order, the index a lookup must return first among equal keys
    (the last one when `last`), as array('i') bytes for the model index. Not on the cold path."""
    sign = -1 if last else 1
    return array.array("i", sorted(range(len(keys)), key=lambda i: (keys[i], sign * i))).tobytes()


class OrderError(ValueError):
    """A saved order that is not a sorted order of these keys (a damaged or foreign index)."""


class SortedLookup:
    """A read-only str -> index map over `keys` by bisection over `order` (sorted_order's), each
    probe reading keys[order[i]]: nothing is built, so it is ready as soon as the order is loaded."""

    __slots__ = ("_keys", "_order", "_key")

    def __init__(self, keys: Sequence[str], order: bytes):
        idx = array.array("i")
        idx.frombytes(order)
        n = len(keys)
        # A cheap check, not a proof (the index is written whole and keyed by the file): the length,
        # and a sample in bounds and in order. An entry past the end that the sample missed raises
        # OrderError from get() when a probe reaches it (the tokenizer then falls back to dicts).
        sample = [idx[j] for j in range(0, len(idx), 997)]
        if len(idx) != n or any(not 0 <= i < n for i in sample) or \
                any(keys[a] > keys[b] for a, b in zip(sample, sample[1:])):
            raise OrderError(f"not a sorted order of these {n} keys")
        self._keys, self._order, self._key = keys, idx, keys.__getitem__

    def get(self, key: str, default=None):
        order = self._order
        try:
            i = bisect_left(order, key, key=self._key)
            if i < len(order) and self._keys[order[i]] == key:
                return order[i]
        except IndexError:
            raise OrderError(f"the saved order of these {len(order)} keys has an entry out of range") from None
        return default

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def __getitem__(self, key: str) -> int:
        v = self.get(key)
        if v is None:
            raise KeyError(key)
        return v
