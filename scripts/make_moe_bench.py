#!/usr/bin/env python3
"""Write a Qwen3-30B-A3B-shaped GGUF (architecture qwen3moe) with random Q8_0 weights and few
layers, for GPU bandwidth benchmarks on machines with no network.

    python scripts/make_moe_bench.py --out /tmp/moe/qwen3moe-bench-q8_0.gguf [--layers 4]
        [--template T.gguf] [--seed 0] [--set hidden=2048 --set experts=128 ...]

Why not transformers + llama.cpp's converter: at these shapes (128 experts x 3 matrices of
768x2048 per layer) that means GBs of float weights and a quantization pass. Here the Q8_0 blocks
are made directly: one pool of random blocks per row length, tiled to the largest tensor that
needs it, and every tensor is a slice of that at a random block offset (no per-tensor copy).

The file mirrors what convert_hf_to_gguf.py writes for qwen3moe (checked against the tiny
converter-made fixture of scripts/fixtures/qwen3moe.py): the same general.* / qwen3moe.* keys in
the same order, tokenizer.* copied verbatim from --template (default: that fixture), the same
tensor names, shapes and order, default alignment. Weights: every matrix Q8_0 with std about
0.5/sqrt(row length), so activations stay finite through the layers; norms F32 ones; router
(ffn_gate_inp) F32 like the converter keeps it, std 4/sqrt(n_embd) so scores are well separated.

Library use (the benchmark): write_moe_bench(out, layers=..., **shape) -> Path, and
active_bytes_per_token(path) -> bytes of weights one decode token reads.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

ARCH = "qwen3moe"
# Qwen3-30B-A3B. `ff` (the dense intermediate size) is written but used by no layer.
DEFAULT_SHAPE = dict(hidden=2048, experts=128, used=8, expert_ff=768, ff=6144, heads=32, kv_heads=4,
                     head_dim=128, context=40960, rope_base=1e6, eps=1e-6)
_FLOAT_KEYS = ("rope_base", "eps")

QK8_0, Q8_0_BYTES = 32, 34  # Q8_0 block: f16 scale d, then 32 int8; weight = d * q
_Q8_0_ID = 7  # llama_ftype MOSTLY_Q8_0 (general.file_type)
# Blocks in the random pool: a prime, so rows (a power-of-two number of blocks) start at a
# different place in the pool for a long stretch and experts do not repeat each other.
_POOL_BLOCKS = 131071
_Q_STD = math.sqrt((255 ** 2 - 1) / 12)  # std of an integer uniform in [-127, 127]


def tensor_plan(n_layers: int, vocab: int, s: dict) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, ggml shape, kind) in the converter's order; kind: 'q8' matrix, 'ones' norm, 'router'."""
    e, hd = s["hidden"], s["head_dim"]
    plan = [("output.weight", (e, vocab), "q8"), ("token_embd.weight", (e, vocab), "q8")]
    for il in range(n_layers):
        b = f"blk.{il}."
        plan += [
            (b + "attn_norm.weight", (e,), "ones"),
            (b + "ffn_down_exps.weight", (s["expert_ff"], e, s["experts"]), "q8"),
            (b + "ffn_gate_exps.weight", (e, s["expert_ff"], s["experts"]), "q8"),
            (b + "ffn_up_exps.weight", (e, s["expert_ff"], s["experts"]), "q8"),
            (b + "ffn_gate_inp.weight", (e, s["experts"]), "router"),
            (b + "ffn_norm.weight", (e,), "ones"),
            (b + "attn_k_norm.weight", (hd,), "ones"),
            (b + "attn_k.weight", (e, s["kv_heads"] * hd), "q8"),
            (b + "attn_output.weight", (s["heads"] * hd, e), "q8"),
            (b + "attn_q_norm.weight", (hd,), "ones"),
            (b + "attn_q.weight", (e, s["heads"] * hd), "q8"),
            (b + "attn_v.weight", (e, s["kv_heads"] * hd), "q8"),
        ]
    plan.append(("output_norm.weight", (e,), "ones"))
    return plan


def _q8_nbytes(shape: tuple[int, ...]) -> int:
    return math.prod(shape) // QK8_0 * Q8_0_BYTES


class _Q8Source:
    """Random Q8_0 bytes for every tensor of one row length K, as slices of one periodic buffer."""

    def __init__(self, k: int, max_nbytes: int, rng: np.random.Generator):
        pool = np.empty((_POOL_BLOCKS, Q8_0_BYTES), np.uint8)
        # f16 scale so that d * q has std 0.5 / sqrt(K): unit-variance inputs give outputs of std 0.5
        pool[:, :2] = np.full((_POOL_BLOCKS, 1), 0.5 / math.sqrt(k) / _Q_STD, np.float16).view(np.uint8)
        pool[:, 2:] = rng.integers(-127, 128, size=(_POOL_BLOCKS, QK8_0), dtype=np.int8).view(np.uint8)
        # one pool length of slack, so any block offset in the pool still has max_nbytes after it
        self.buf = np.resize(pool.reshape(-1), max_nbytes + pool.nbytes)
        self.rng = rng

    def take(self, nbytes: int) -> np.ndarray:
        off = int(self.rng.integers(_POOL_BLOCKS)) * Q8_0_BYTES  # block-aligned, so blocks stay whole
        return self.buf[off:off + nbytes]


def _read_template(path: str | os.PathLike) -> list[tuple[str, int, int | None, object]]:
    """The template's tokenizer.* keys as (key, value type, array element type, value)."""
    from quantize_gguf import SourceGGUF  # exact value types, raw string bytes

    keys = [m for m in SourceGGUF(path).metadata if m[0].startswith("tokenizer.")]
    if not any(k == "tokenizer.ggml.tokens" for k, *_ in keys):
        raise SystemExit(f"template {path} has no tokenizer.ggml.tokens")
    return keys


def default_template() -> Path:
    """The tiny converter-made qwen3moe Q8_0 fixture (built once, then cached)."""
    from fixtures import make_fixture

    return Path(make_fixture(ARCH, "q8_0").gguf)


def write_moe_bench(out: str | os.PathLike, layers: int = 4, template: str | os.PathLike | None = None,
                    seed: int = 0, **shape) -> Path:
    """Write the file; shape keys as DEFAULT_SHAPE (unknown keys raise). Returns the path."""
    import gguf
    from gguf import GGMLQuantizationType, GGUFValueType

    bad = set(shape) - set(DEFAULT_SHAPE)
    if bad:
        raise ValueError(f"unknown shape keys {sorted(bad)}; known: {sorted(DEFAULT_SHAPE)}")
    s = {**DEFAULT_SHAPE, **shape}
    for k in ("hidden", "expert_ff"):
        if s[k] % QK8_0:
            raise ValueError(f"{k}={s[k]} must be a multiple of {QK8_0} (Q8_0 rows)")
    if (s["heads"] * s["head_dim"]) % QK8_0 or not 0 < s["used"] <= s["experts"]:
        raise ValueError(f"bad shape {s}")
    tok_keys = _read_template(template if template is not None else default_template())
    vocab = next(len(v) for k, _, _, v in tok_keys if k == "tokenizer.ggml.tokens")
    plan = tensor_plan(layers, vocab, s)

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(out, ARCH)  # adds general.architecture first, as the converter's file has
    # Tensor infos first: the size label below counts parameters from them.
    for name, shp, kind in plan:
        np_shape = tuple(reversed(shp))  # numpy order: ggml shape[0] is the last (contiguous) axis
        if kind == "q8":  # byte shape: the last numpy axis counts bytes (gguf-py's raw convention)
            byte_shape = (*np_shape[:-1], np_shape[-1] // QK8_0 * Q8_0_BYTES)
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), _q8_nbytes(shp), raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor_info(name, np_shape, np.dtype(np.float32), 4 * math.prod(shp))

    # Keys in the order the converter writes them for qwen3moe.
    u32, f32 = GGUFValueType.UINT32, GGUFValueType.FLOAT32
    w.add_type("model")
    w.add_name(f"qwen3moe bench (random Q8_0, {layers} layer{'' if layers == 1 else 's'})")
    w.add_size_label(gguf.size_label(*w.get_total_parameter_count()))
    for key, val, vt in [
        ("block_count", layers, u32), ("context_length", s["context"], u32),
        ("embedding_length", s["hidden"], u32), ("feed_forward_length", s["ff"], u32),
        ("attention.head_count", s["heads"], u32), ("attention.head_count_kv", s["kv_heads"], u32),
        ("rope.freq_base", float(s["rope_base"]), f32), ("attention.layer_norm_rms_epsilon", float(s["eps"]), f32),
        ("expert_count", s["experts"], u32), ("expert_used_count", s["used"], u32),
        ("attention.key_length", s["head_dim"], u32), ("attention.value_length", s["head_dim"], u32),
    ]:
        w.add_key_value(f"{ARCH}.{key}", val, vt)
    w.add_key_value("general.file_type", _Q8_0_ID, u32)
    w.add_key_value(f"{ARCH}.expert_feed_forward_length", s["expert_ff"], u32)
    w.add_key_value("general.quantization_version", 2, u32)
    for key, vtype, etype, value in tok_keys:
        w.add_key_value(key, value, GGUFValueType(vtype), sub_type=None if etype is None else GGUFValueType(etype))

    w.write_header_to_file(out)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    sources: dict[int, _Q8Source] = {}
    max_by_k: dict[int, int] = {}
    for _, shp, kind in plan:
        if kind == "q8":
            max_by_k[shp[0]] = max(max_by_k.get(shp[0], 0), _q8_nbytes(shp))
    for name, shp, kind in plan:
        if kind == "q8":
            k = shp[0]
            if k not in sources:
                sources[k] = _Q8Source(k, max_by_k[k], rng)
            w.write_tensor_data(sources[k].take(_q8_nbytes(shp)))
        elif kind == "ones":
            w.write_tensor_data(np.ones(shp, np.float32))
        else:  # router: ggml {n_embd, n_expert} = numpy (n_expert, n_embd)
            n_embd = shp[0]
            w.write_tensor_data(rng.standard_normal(shp[::-1], dtype=np.float32) * np.float32(4 / math.sqrt(n_embd)))
    w.close()
    return out


def active_bytes_per_token(path: str | os.PathLike) -> int:
    """Weight bytes one decode token reads: every tensor whole, except the expert stacks
    (expert_used_count / expert_count of them) and the token embedding (one row, unless it is also
    the LM head of a tied model)."""
    root = str(Path(__file__).resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    from reflex_runtime.modelfile.gguf_file import GGUFFile

    with GGUFFile(path) as g:
        used = g.arch_get("expert_used_count")
        tied = "output.weight" not in g.tensors
        total = 0
        for ti in g.tensors.values():
            if ti.name.endswith("_exps.weight"):
                total += ti.nbytes // ti.shape[-1] * used
            elif ti.name == "token_embd.weight" and not tied:
                total += ti.nbytes // ti.shape[1]
            else:
                total += ti.nbytes
        return total


def parse_shape_overrides(items: list[str], known, float_keys=(), zero_ok=()) -> dict:
    """--set KEY=VALUE items -> shape overrides (the bench-file makers share it); ValueError (one
    line) on a bad one: an unknown key, a value of the wrong kind, or one below 1 (0 where allowed)."""
    known = list(known)
    out = {}
    for item in items:
        key, sep, val = item.partition("=")
        if not sep or key not in known:
            raise ValueError(f"--set wants KEY=VALUE with KEY one of {', '.join(known)}; got {item!r}")
        try:
            out[key] = float(val) if key in float_keys else int(val)
        except ValueError:
            raise ValueError(f"--set {key} wants a {'number' if key in float_keys else 'whole number'}; "
                             f"got {val!r}") from None
        if out[key] < 0 or (out[key] == 0 and key not in zero_ok):
            raise ValueError(f"--set {key} must be positive; got {val!r}")
    return out


def _parse_set(items: list[str]) -> dict:
    return parse_shape_overrides(items, DEFAULT_SHAPE, _FLOAT_KEYS)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output .gguf path")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--template", help="GGUF whose tokenizer.* keys are copied (default: the tiny qwen3moe fixture)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help=f"shape override; keys: {', '.join(f'{k}={v:g}' for k, v in DEFAULT_SHAPE.items())}")
    a = p.parse_args(argv)
    if a.layers < 1:
        p.error(f"--layers must be at least 1; got {a.layers}")
    try:
        shape = _parse_set(a.set)
    except ValueError as e:
        p.error(str(e))
    t0 = time.perf_counter()
    path = write_moe_bench(a.out, a.layers, a.template, a.seed, **shape)
    secs = time.perf_counter() - t0
    active = active_bytes_per_token(path)
    print(f"{path} {path.stat().st_size / 1e9:.3f} GB in {secs:.1f} s; "
          f"active bytes per token {active} ({active / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
