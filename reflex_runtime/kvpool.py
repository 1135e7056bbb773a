"""The paged KV cache's block pool (continuous batching, scheduler.py).

Every sequence of a batch sees its own range of `max_context` logical cache slots; the memory
behind them is a pool of fixed-size blocks of KV_BLOCK slots, sized once at load, that a block
table maps logical blocks to (kernels/common.cuh rx_kv_row). A sequence takes the blocks for its
prompt and max_tokens when it is admitted and gives them back when it ends, so the pool holds
the tokens requests actually ask for, not max_context per sequence: when it is full, requests
wait in the queue (NoRoom), they are never cut short. Taking everything up front means a running
sequence never needs a block mid-way, so nothing is ever preempted.

The CUDA runner (gpu/batch.py) writes the table on the device; the numpy runner
(reference/runner.py) keeps the same accounting, so the scheduler's waiting is tested on CPUs.
"""

from __future__ import annotations

from .errors import NoRoom

KV_BLOCK = 16  # cache slots per block: kernels/common.cuh RX_KV_BLOCK


def blocks_for(n_tokens: int) -> int:
    return -(-n_tokens // KV_BLOCK)


class BlockPool:
    """Block ids first .. first + n - 1 of the physical cache, handed out whole."""

    def __init__(self, first: int, n: int):
        self.n = n
        self._free = list(range(first + n - 1, first - 1, -1))  # pop() hands out the lowest first

    @property
    def free_tokens(self) -> int:
        return len(self._free) * KV_BLOCK

    @property
    def tokens(self) -> int:
        return self.n * KV_BLOCK

    def take(self, n_tokens: int) -> list[int]:
        """Blocks for n_tokens slots, or NoRoom (nothing taken) when too few are free."""
        k = blocks_for(n_tokens)
        if k > self.n:  # a caller's own check should have said so (the context): never wait for it
            raise ValueError(f"{n_tokens} tokens exceed the whole pool of {self.tokens}")
        if k > len(self._free):
            raise NoRoom(f"the KV cache has {self.free_tokens} of {self.tokens} tokens free; {n_tokens} are needed")
        return [self._free.pop() for _ in range(k)]

    def give(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))
