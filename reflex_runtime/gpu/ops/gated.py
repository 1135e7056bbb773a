"""kernels/gated.cu: Qwen3.5's sigmoid gates: splitting per-head [query | gate] rows, and
y *= sigmoid(g) (the attention output gate, the shared expert's gate)."""

from __future__ import annotations

from ctypes import c_int, c_long, c_void_p

KERNELS = ("reflex_gate_split", "reflex_sigmoid_mul")


def gate_split(L, qg: int, q: int, gate: int, n: int, hd: int) -> None:
    """Per-head [query | gate] rows -> q, gate ((n / hd) rows of hd floats each)."""
    L.go("reflex_gate_split", (n + 255) // 256, 256, [c_void_p(qg), c_void_p(q), c_void_p(gate), c_long(n), c_int(hd)])


def sigmoid_mul(L, y: int, g: int, n: int, group: int = 1) -> None:
    """y[i] *= sigmoid(g[i // group]) for i < n."""
    L.go("reflex_sigmoid_mul", (n + 255) // 256, 256, [c_void_p(y), c_void_p(g), c_long(n), c_int(group)])
