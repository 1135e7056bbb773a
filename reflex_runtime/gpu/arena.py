"""One device allocation for a model: its weights (the GGUF data region, copied whole), caches,
activations and decode state, each a named 256-byte aligned piece of it."""

from __future__ import annotations


class Arena:
    """Bump allocator over one device allocation. Pieces are reserved by name before the
    allocation exists (sizes come from the config); `base` is set once it does."""

    def __init__(self):
        self.size = 0
        self.base = 0
        self.offsets: dict[str, int] = {}
        self.sizes: dict[str, int] = {}

    def reserve(self, name: str, nbytes: int) -> None:
        """A piece of at least nbytes; reserving a name again keeps the larger size (blocks that
        share a scratch buffer each ask for what they need)."""
        nbytes = -(-max(nbytes, 4) // 256) * 256
        if name in self.offsets:
            if nbytes <= self.sizes[name]:
                return
            raise ValueError(f"arena piece '{name}' grows after it was placed")
        self.offsets[name] = self.size
        self.sizes[name] = nbytes
        self.size += nbytes

    def reserve_f32(self, pieces) -> None:
        """(name, element count) pairs of 4-byte elements (floats or ints)."""
        for name, count in pieces:
            self.reserve(name, 4 * count)

    def ptr(self, name: str) -> int:
        return self.base + self.offsets[name]
