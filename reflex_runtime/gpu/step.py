"""What one step of the CUDA runner works on (the runner's step API, gpu/runner.py): a batch of
sequences, each with its new tokens this step, where they go (positions and cache slots), and
what to pick after them.

A prompt is a step whose sequences bring their tokens from the host; a decode step brings one
token per sequence that the previous pick left on the device. Today a runner holds one
sequence; batching (issue 32) widens `Step.seqs` (and the device-side state behind it) without
changing the calls: prefill(step), forward(step), pick(step), read_back / token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..sampling import Pick, SamplingParams  # noqa: F401 (Pick lives in sampling.py; gpu code imports it here)


@dataclass(frozen=True)
class Seq:
    """One sequence's part of a step: `n` new tokens at positions start .. start + n - 1, in cache
    slots slot .. slot + n - 1 (default: the positions). `tokens` are the ids when the host has
    them (a prompt, a forced token); None when the device holds them (a decode step, whose
    position the device knows too: start None). `pick`: what to choose after the last of them
    (None: nothing, e.g. a prompt chunk before the last)."""

    start: int | None
    n: int = 1
    tokens: Sequence[int] | None = None
    slot: int | None = None
    pick: Pick | None = None

    @classmethod
    def prompt(cls, ids: Sequence[int], start: int = 0, pick: Pick | None = None) -> "Seq":
        return cls(start, len(ids), list(ids), None, pick)

    @classmethod
    def decode(cls, pick: Pick | None = None) -> "Seq":
        """A decode step's part: the one token the previous pick left on the device."""
        return cls(None, 1, None, None, pick)

    @property
    def first_slot(self) -> int:
        return self.start if self.slot is None else self.slot


@dataclass(frozen=True)
class Step:
    """The sequences of one step, in the order their tokens sit in the step's rows."""

    seqs: tuple[Seq, ...]

    @classmethod
    def of(cls, *seqs: Seq) -> "Step":
        return cls(tuple(seqs))

    @property
    def n_tokens(self) -> int:
        return sum(s.n for s in self.seqs)

    def last_rows(self) -> list[int]:
        """Row of each sequence's last token in this step (where its pick reads the logits)."""
        rows, at = [], 0
        for s in self.seqs:
            at += s.n
            rows.append(at - 1)
        return rows


def int_array(values):
    """A step's per-token ints as the host buffer they are copied to the device from (int32)."""
    import array

    return array.array("i", values)
