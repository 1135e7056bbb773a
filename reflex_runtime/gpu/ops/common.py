"""What every ops module shares, as kernels/common.cuh is what every kernel file shares: the
weight types the kernels decode (RX_FOR_EACH_TYPE, kernels/quant.cuh) and a weight matrix as
the kernels see it."""

from __future__ import annotations

from dataclasses import dataclass

# ggml type name -> kernel suffix, in RX_FOR_EACH_TYPE's order
WEIGHT_TYPES = {
    "F32": "f32", "F16": "f16", "BF16": "bf16", "Q8_0": "q8_0", "Q4_0": "q4_0", "Q5_0": "q5_0",
    "Q4_1": "q4_1", "Q5_1": "q5_1",
    "Q4_K": "q4_k", "Q5_K": "q5_k", "Q6_K": "q6_k",
}


def per_type(*patterns: str) -> tuple[str, ...]:
    """Kernel names instantiated for every weight type: per_type("reflex_mv_{}") -> reflex_mv_f32, ..."""
    return tuple(p.format(s) for p in patterns for s in WEIGHT_TYPES.values())


@dataclass(frozen=True)
class Weight:
    """A matrix in its GGUF blocks on the device: `rows` rows of `k` weights, `row_bytes` apart."""

    ptr: int
    type_name: str
    rows: int  # output features
    k: int  # input features (row length)
    row_bytes: int

    @property
    def suffix(self) -> str:
        return WEIGHT_TYPES[self.type_name]

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes
