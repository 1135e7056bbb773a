"""Random GGUF weight blocks for kernel tests: valid layouts, finite varied scales, and the
gguf-py dequantization they must agree with."""

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

# type -> (block size, bytes per block, byte offsets of f16 scale fields inside a block)
LAYOUT = {
    Q.F32: (1, 4, ()), Q.F16: (1, 2, ()), Q.BF16: (1, 2, ()),
    Q.Q8_0: (32, 34, (0,)), Q.Q4_0: (32, 18, (0,)), Q.Q5_0: (32, 22, (0,)),
    Q.Q4_1: (32, 20, (0, 2)), Q.Q5_1: (32, 24, (0, 2)),
    Q.Q4_K: (256, 144, (0, 2)), Q.Q5_K: (256, 176, (0, 2)), Q.Q6_K: (256, 210, (208,)),
}


def random_row(qtype, k, rng):
    """k weights (a whole number of blocks) of type qtype, as raw bytes (uint8 array)."""
    bs, ts, scale_offsets = LAYOUT[qtype]
    n_blocks = k // bs
    if qtype == Q.F32:
        return rng.standard_normal(k).astype(np.float32).view(np.uint8)
    if qtype == Q.F16:
        return rng.standard_normal(k).astype(np.float16).view(np.uint8)
    if qtype == Q.BF16:
        return (rng.standard_normal(k).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    blocks = rng.integers(0, 256, size=(n_blocks, ts), dtype=np.uint8)
    for off in scale_offsets:  # finite, varied scales (random bits would include inf/nan)
        scales = (rng.standard_normal(n_blocks) * 0.05).astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
        blocks[:, off:off + 2] = scales
    return blocks.reshape(-1)


def random_matrix(qtype, rows, k, rng):
    """(raw bytes of a rows x k matrix, its float32 dequantization)."""
    raw = np.ascontiguousarray(random_row(qtype, rows * k, rng))
    return raw, dequantize(raw, qtype).astype(np.float32).reshape(rows, k)
