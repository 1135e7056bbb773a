"""The GGML tensor types and GGUF value types, as plain tables.

These are the format's facts from the `gguf` package (gguf.constants), re-stated here because
`import gguf` pulls numpy in and costs ~0.35 s on the cold path. tests/test_ggml_types.py
checks every row against the installed `gguf` package, so the two cannot drift.
"""

from typing import NamedTuple


class GGMLType(NamedTuple):
    name: str
    type_id: int
    block_size: int  # elements per block
    type_size: int  # bytes per block


_TYPES = [
    GGMLType("F32", 0, 1, 4),
    GGMLType("F16", 1, 1, 2),
    GGMLType("Q4_0", 2, 32, 18),
    GGMLType("Q4_1", 3, 32, 20),
    GGMLType("Q5_0", 6, 32, 22),
    GGMLType("Q5_1", 7, 32, 24),
    GGMLType("Q8_0", 8, 32, 34),
    GGMLType("Q8_1", 9, 32, 40),
    GGMLType("Q2_K", 10, 256, 84),
    GGMLType("Q3_K", 11, 256, 110),
    GGMLType("Q4_K", 12, 256, 144),
    GGMLType("Q5_K", 13, 256, 176),
    GGMLType("Q6_K", 14, 256, 210),
    GGMLType("Q8_K", 15, 256, 292),
    GGMLType("IQ2_XXS", 16, 256, 66),
    GGMLType("IQ2_XS", 17, 256, 74),
    GGMLType("IQ3_XXS", 18, 256, 98),
    GGMLType("IQ1_S", 19, 256, 50),
    GGMLType("IQ4_NL", 20, 32, 18),
    GGMLType("IQ3_S", 21, 256, 110),
    GGMLType("IQ2_S", 22, 256, 82),
    GGMLType("IQ4_XS", 23, 256, 136),
    GGMLType("I8", 24, 1, 1),
    GGMLType("I16", 25, 1, 2),
    GGMLType("I32", 26, 1, 4),
    GGMLType("I64", 27, 1, 8),
    GGMLType("F64", 28, 1, 8),
    GGMLType("IQ1_M", 29, 256, 56),
    GGMLType("BF16", 30, 1, 2),
    GGMLType("TQ1_0", 34, 256, 54),
    GGMLType("TQ2_0", 35, 256, 66),
    GGMLType("MXFP4", 39, 32, 17),
]

GGML_TYPES: dict[int, GGMLType] = {t.type_id: t for t in _TYPES}
GGML_TYPES_BY_NAME: dict[str, GGMLType] = {t.name: t for t in _TYPES}

# Types whose blocks our kernels and the reference read directly (issue 4's list).
COMPUTE_TYPES = frozenset({"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"})

# GGUF metadata value types: id -> (name, fixed size in bytes or 0 for string/array).
GGUF_VALUE_TYPES: dict[int, tuple[str, int]] = {
    0: ("UINT8", 1),
    1: ("INT8", 1),
    2: ("UINT16", 2),
    3: ("INT16", 2),
    4: ("UINT32", 4),
    5: ("INT32", 4),
    6: ("FLOAT32", 4),
    7: ("BOOL", 1),
    8: ("STRING", 0),
    9: ("ARRAY", 0),
    10: ("UINT64", 8),
    11: ("INT64", 8),
    12: ("FLOAT64", 8),
}

GGUF_MAGIC = 0x46554747  # b"GGUF" read as little-endian uint32
GGUF_DEFAULT_ALIGNMENT = 32


def type_name(type_id: int) -> str:
    t = GGML_TYPES.get(type_id)
    return t.name if t else f"unknown({type_id})"


def tensor_nbytes(type_id: int, n_elements: int) -> int:
    t = GGML_TYPES[type_id]
    return n_elements // t.block_size * t.type_size
