#!/usr/bin/env python3
"""Carry a GGUF's shape without its weights, and rebuild a same-shaped file with random weights.

    python scripts/gguf_skeleton.py take MODEL.gguf SKELETON.gguf     # the header only (metadata,
                                                                      # tokenizer, tensor directory)
    python scripts/gguf_skeleton.py fill SKELETON.gguf OUT.gguf [--seed 0]

For timing on a machine that cannot download the real file (the GPU machine): cold start,
prefill and decode depend on the tensors' types, shapes and offsets and on the tokenizer, not on
the weights' values, so a file with the real header and random weights times like the real one.
`take` copies the bytes before the tensor data (for the embedded Gemma 3 270M: 6.5 MB of a 253 MB
file) plus a trailer with the whole file's size; `fill` writes random, valid weight data for every tensor at its offset (finite f16 scales,
small values) so activations stay finite. Correctness is never judged on such a file except
against the reference on the same file.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# ggml type -> (weights per block, bytes per block, offsets of f16 scale fields in a block)
_BLOCKS = {0: (1, 4, ()), 1: (1, 2, ()), 30: (1, 2, ()), 8: (32, 34, (0,)), 2: (32, 18, (0,)), 3: (32, 20, (0, 2)),
           6: (32, 22, (0,)), 7: (32, 24, (0, 2)), 12: (256, 144, (0, 2)), 13: (256, 176, (0, 2)),
           14: (256, 210, (208,))}


_TRAILER = b"RXSKEL"


def take(src: str, dst: str) -> None:
    from reflex_runtime.modelfile.gguf_file import GGUFFile

    g = GGUFFile(src)
    with open(src, "rb") as f:
        head = f.read(g.data_offset)
    with open(dst, "wb") as f:
        f.write(head + _TRAILER + g.size.to_bytes(8, "little"))
    print(f"{dst}: {len(head)} bytes of header; the data region was {g.size - g.data_offset} bytes", flush=True)


def _random_data(ggml_type: int, n_elements: int, k: int, rng) -> bytes:
    if ggml_type not in _BLOCKS:
        raise SystemExit(f"gguf_skeleton: no random data for ggml type {ggml_type}")
    per, nbytes, scales = _BLOCKS[ggml_type]
    if ggml_type == 0:
        return (rng.standard_normal(n_elements, dtype=np.float32) * (0.5 / np.sqrt(k)) + (1.0 if n_elements == k else 0)
                ).astype(np.float32).tobytes()  # vectors (norms) near 1, matrices small
    if ggml_type in (1, 30):
        x = (rng.standard_normal(n_elements, dtype=np.float32) * (0.5 / np.sqrt(k))).astype(np.float32)
        return x.astype(np.float16).tobytes() if ggml_type == 1 else (x.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    n_blocks = n_elements // per
    blocks = rng.integers(0, 256, size=(n_blocks, nbytes), dtype=np.uint8)
    for off in scales:  # finite scales, sized so a dot product of k weights stays O(1)
        d = (rng.random(n_blocks, dtype=np.float32) * (2.0 / (16 * np.sqrt(k))) + 1e-4).astype(np.float16)
        blocks[:, off:off + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    return blocks.tobytes()


def fill(skeleton: str, dst: str, seed: int = 0) -> None:
    from reflex_runtime.modelfile.gguf_file import GGUFFile

    with open(skeleton, "rb") as f:
        blob = f.read()
    if blob[-14:-8] != _TRAILER:
        raise SystemExit(f"gguf_skeleton: {skeleton} was not written by `take`")
    head, size = blob[:-14], int.from_bytes(blob[-8:], "little")
    tmp = dst + ".tmp"
    with open(tmp, "wb") as f:
        f.write(head)
        f.flush()
        os.ftruncate(f.fileno(), size)  # zeros (sparse) until every tensor is written below
    g = GGUFFile(tmp)
    rng = np.random.default_rng(seed)
    fd = os.open(tmp, os.O_WRONLY)
    try:
        for ti in g.tensors.values():
            os.pwrite(fd, _random_data(ti.ggml_type, ti.n_elements, ti.shape[0], rng), ti.offset)  # absolute
    finally:
        os.close(fd)
    os.replace(tmp, dst)
    print(f"{dst}: {size} bytes, {len(g.tensors)} tensors of random weights", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("take", help="write the header of MODEL (no tensor data) to SKELETON")
    t.add_argument("model")
    t.add_argument("skeleton")
    f = sub.add_parser("fill", help="write SKELETON's header plus random weights to OUT")
    f.add_argument("skeleton")
    f.add_argument("out")
    f.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.cmd == "take":
        take(args.model, args.skeleton)
    else:
        fill(args.skeleton, args.out, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
