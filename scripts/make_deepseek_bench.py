#!/usr/bin/env python3
"""Write a full-depth DeepSeek-V2-Lite-shaped GGUF (architecture deepseek2) with random weights,
in Q8_0 or Q4_K_M, for GPU benchmarks against llama.cpp on machines with no network.

    python scripts/make_deepseek_bench.py --out /tmp/ds/v2lite-q8_0.gguf [--type Q4_K_M]
        [--layers 27] [--template T.gguf] [--seed 0] [--set hidden=2048 --set experts=64 ...]

Shape (DEFAULT_SHAPE): 27 layers, hidden 2048, 16 heads, kv_lora_rank 512, qk_rope 64 / qk_nope
128 / v_head 128, 64 routed + 2 shared experts, top-6, expert FFN 1408, the first layer dense;
the rest from DeepSeek-V2-Lite's published config.json
(https://huggingface.co/deepseek-ai/DeepSeek-V2-Lite/blob/main/config.json; read through copies
that keep it whole, e.g. huggingface.co/ModelCloud/DeepSeek-V2-Lite-gptq-4bit/blob/main/config.json):
vocab 102400, dense intermediate 10944, no q_lora, max_position_embeddings 163840, rope_theta
10000, YaRN factor 40 over 4096 positions with beta_fast 32 / beta_slow 1 and mscale =
mscale_all_dim = 0.707, rms_norm_eps 1e-6, softmax routing in one group ("greedy"), top-k weights
not renormalized, routed_scaling_factor 1.0, untied LM head.

Like scripts/make_moe_bench.py, the blocks are written directly (no transformers model, no
converter, no quantization pass): one pool of random blocks per (type, row length), every tensor
a slice of it at a random block offset. Any bit pattern is a valid block once its f16 scales are
finite; the scales are set so that the decoded weights have std about 0.5/sqrt(row length)
(measured on the pool with gguf-py's dequantize), so activations stay finite through the layers.

What the file holds mirrors llama.cpp: the keys, their order and the tensor order of
convert_hf_to_gguf.py's deepseek2 output (the tiny converter-made fixtures of
scripts/fixtures/deepseek.py), the tensors src/models/deepseek2.cpp loads (split attn_k_b /
attn_v_b, the MLA key/value lengths, head_count_kv 1), tokenizer.* copied from --template
(default: llama.cpp's ggml-vocab-deepseek-llm.gguf, the 102400-token DeepSeek LLM vocabulary that
V2 uses). Types as the pinned llama.cpp's tools make them: Q8_0 = every matrix Q8_0 (the
converter's --outtype q8_0); Q4_K_M = src/llama-quant.cpp's recipe: Q4_K; Q6_K for output.weight
and for ffn_down* in the "more bits" layers (the first eighth, from 7/8 on, every third between);
rows that are not a multiple of 256 fall back (Q4_K -> Q5_0, Q6_K -> Q8_0): attn_k_b (rows of
128), ffn_down_exps (1408), the dense ffn_down (10944). Router and norms stay F32.

Library use: write_deepseek_bench(out, type_name, layers, **shape) -> Path; tensor_plan(...);
kv_cache_bytes(path) (latent vs expanded KV bytes per token).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

_HERE = Path(__file__).resolve().parent
for _p in (str(_HERE), str(_HERE.parent)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

ARCH = "deepseek2"
DEFAULT_SHAPE = dict(hidden=2048, heads=16, kv_lora=512, rope=64, nope=128, v_head=128, q_lora=0, experts=64,
                     used=6, shared=2, expert_ff=1408, ff=10944, dense_layers=1, context=163840, rope_base=10000.0,
                     eps=1e-6, yarn_factor=40.0, yarn_orig_ctx=4096, yarn_mscale_all_dim=0.707)
_FLOAT_KEYS = ("rope_base", "eps", "yarn_factor", "yarn_mscale_all_dim")
FILE_TYPES = {"Q8_0": 7, "Q4_K_M": 15}  # llama_ftype written to general.file_type

# ggml type ids and block layouts (gguf.GGMLQuantizationType)
_BLOCKS = {"Q8_0": (8, 32, 34), "Q5_0": (6, 32, 22), "Q4_K": (12, 256, 144), "Q6_K": (14, 256, 210)}
_POOL_BLOCKS = 131071  # a prime: rows (a power-of-two number of blocks or not) start all over the pool


def more_bits(il: int, n_layers: int) -> bool:
    """llama-quant.cpp's use_more_bits: Q4_K_M's Q6_K layers for ffn_down (and attn_v)."""
    return il < n_layers // 8 or il >= 7 * n_layers // 8 or (il - n_layers // 8) % 3 == 2


def _kquant(name: str, row: int, il: int, n_layers: int) -> str:
    """The Q4_K_M type of a matrix (row = ggml ne[0]), with llama.cpp's fallback for rows that
    are not a multiple of 256."""
    want = "Q4_K"
    if name == "output.weight" or (".ffn_down" in name and more_bits(il, n_layers)):
        want = "Q6_K"
    if row % 256:
        want = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}[want]
    return want


def tensor_plan(n_layers: int, vocab: int, s: dict, type_name: str = "Q8_0") -> list[tuple[str, tuple[int, ...], str]]:
    """(name, ggml shape, kind) in the converter's order; kind: a block type, 'ones' (norms) or
    'router' (F32 ffn_gate_inp)."""
    e, h, r, rope, nope, v = s["hidden"], s["heads"], s["kv_lora"], s["rope"], s["nope"], s["v_head"]
    fe, fs = s["expert_ff"], s["expert_ff"] * s["shared"]
    mats: list[tuple[str, tuple[int, ...], int]] = [("output.weight", (e, vocab), -1), ("token_embd.weight", (e, vocab), -1)]
    plan: list[tuple[str, tuple[int, ...], str]] = []

    def mat(name, shape, il):
        kind = "Q8_0" if type_name == "Q8_0" else _kquant(name, shape[0], il, n_layers)
        plan.append((name, shape, kind))

    for name, shape, il in mats:
        mat(name, shape, il)
    for il in range(n_layers):
        b = f"blk.{il}."
        plan.append((b + "attn_norm.weight", (e,), "ones"))
        if il < s["dense_layers"]:
            mat(b + "ffn_down.weight", (s["ff"], e), il)
            mat(b + "ffn_gate.weight", (e, s["ff"]), il)
            mat(b + "ffn_up.weight", (e, s["ff"]), il)
        else:
            mat(b + "ffn_down_exps.weight", (fe, e, s["experts"]), il)
            mat(b + "ffn_gate_exps.weight", (e, fe, s["experts"]), il)
            mat(b + "ffn_up_exps.weight", (e, fe, s["experts"]), il)
            plan.append((b + "ffn_gate_inp.weight", (e, s["experts"]), "router"))
            if fs:
                mat(b + "ffn_down_shexp.weight", (fs, e), il)
                mat(b + "ffn_gate_shexp.weight", (e, fs), il)
                mat(b + "ffn_up_shexp.weight", (e, fs), il)
        plan.append((b + "ffn_norm.weight", (e,), "ones"))
        plan.append((b + "attn_kv_a_norm.weight", (r,), "ones"))
        mat(b + "attn_kv_a_mqa.weight", (e, r + rope), il)
        mat(b + "attn_k_b.weight", (nope, r, h), il)
        mat(b + "attn_v_b.weight", (r, v, h), il)
        mat(b + "attn_output.weight", (h * v, e), il)
        if s["q_lora"]:
            plan.append((b + "attn_q_a_norm.weight", (s["q_lora"],), "ones"))
            mat(b + "attn_q_a.weight", (e, s["q_lora"]), il)
            mat(b + "attn_q_b.weight", (s["q_lora"], h * (nope + rope)), il)
        else:
            mat(b + "attn_q.weight", (e, h * (nope + rope)), il)
    plan.append(("output_norm.weight", (e,), "ones"))
    return plan


def _nbytes(kind: str, shape: tuple[int, ...]) -> int:
    _, block, size = _BLOCKS[kind]
    return math.prod(shape) // block * size


def _set_scales(pool: np.ndarray, kind: str, d: float) -> None:
    """Write the f16 scale fields of every block: d (and Q4_K's dmin = 7.5 d, which centres the
    mean of d*sc*q - dmin*m for uniform 6-bit sc, m and 4-bit q near zero)."""
    def f16(x):
        return np.full((pool.shape[0], 1), x, np.float16).view(np.uint8)

    if kind in ("Q8_0", "Q5_0"):
        pool[:, 0:2] = f16(d)
    elif kind == "Q4_K":
        pool[:, 0:2], pool[:, 2:4] = f16(d), f16(7.5 * d)
    else:  # Q6_K: d is the block's last two bytes
        pool[:, 208:210] = f16(d)


class _BlockSource:
    """Random blocks of one type for every tensor of one row length K, as slices of one
    periodic buffer (a pool tiled to the largest tensor that needs it)."""

    def __init__(self, kind: str, k: int, max_nbytes: int, rng: np.random.Generator):
        import gguf

        type_id, block, size = _BLOCKS[kind]
        pool = rng.integers(0, 256, size=(_POOL_BLOCKS, size), dtype=np.uint8)
        _set_scales(pool, kind, 1.0)
        sample = pool[:4096]
        std = float(np.std(gguf.quants.dequantize(sample.reshape(-1), gguf.GGMLQuantizationType(type_id))))
        _set_scales(pool, kind, 0.5 / math.sqrt(k) / std)
        self.size = size
        self.buf = np.resize(pool.reshape(-1), max_nbytes + pool.nbytes)
        self.rng = rng

    def take(self, nbytes: int) -> np.ndarray:
        off = int(self.rng.integers(_POOL_BLOCKS)) * self.size  # block-aligned, so blocks stay whole
        return self.buf[off:off + nbytes]


def default_template() -> Path:
    """llama.cpp's DeepSeek LLM vocabulary file (the pinned sdist's models/, cached by the tests)."""
    from llama_cpp_sdist import llama_cpp_dir

    return llama_cpp_dir() / "models" / "ggml-vocab-deepseek-llm.gguf"


def write_deepseek_bench(out: str | os.PathLike, type_name: str = "Q8_0", layers: int = 27,
                         template: str | os.PathLike | None = None, seed: int = 0, **shape) -> Path:
    """Write the file; shape keys as DEFAULT_SHAPE (unknown keys raise). Returns the path."""
    import gguf
    from gguf import GGMLQuantizationType, GGUFValueType
    from make_moe_bench import _read_template

    if type_name not in FILE_TYPES:
        raise ValueError(f"type {type_name!r}: choose one of {', '.join(FILE_TYPES)}")
    bad = set(shape) - set(DEFAULT_SHAPE)
    if bad:
        raise ValueError(f"unknown shape keys {sorted(bad)}; known: {sorted(DEFAULT_SHAPE)}")
    s = {**DEFAULT_SHAPE, **shape}
    for key in ("hidden", "kv_lora", "nope", "expert_ff", "ff"):
        if s[key] % 32:
            raise ValueError(f"{key}={s[key]} must be a multiple of 32 (block rows)")
    if s["rope"] % 2 or not 0 < s["used"] <= s["experts"] or not 0 <= s["dense_layers"] <= layers:
        raise ValueError(f"bad shape {s}")
    tok_keys = _read_template(template if template is not None else default_template())
    vocab = next(len(v) for k, _, _, v in tok_keys if k == "tokenizer.ggml.tokens")
    plan = tensor_plan(layers, vocab, s, type_name)

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(out, ARCH)
    for name, shp, kind in plan:
        np_shape = tuple(reversed(shp))
        if kind in _BLOCKS:  # byte shape: the last numpy axis counts bytes (gguf-py's raw convention)
            _, block, size = _BLOCKS[kind]
            byte_shape = (*np_shape[:-1], np_shape[-1] // block * size)
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), _nbytes(kind, shp),
                              raw_dtype=GGMLQuantizationType(_BLOCKS[kind][0]))
        else:
            w.add_tensor_info(name, np_shape, np.dtype(np.float32), 4 * math.prod(shp))

    u32, f32, st = GGUFValueType.UINT32, GGUFValueType.FLOAT32, GGUFValueType.STRING
    w.add_type("model")
    w.add_name(f"deepseek2 bench (random {type_name}, {layers} layer{'' if layers == 1 else 's'})")
    w.add_size_label(gguf.size_label(*w.get_total_parameter_count()))
    k_mla, h = s["nope"] + s["rope"], s["heads"]
    keys = [
        ("block_count", layers, u32), ("context_length", s["context"], u32), ("embedding_length", s["hidden"], u32),
        ("feed_forward_length", s["ff"], u32), ("attention.head_count", h, u32), ("attention.head_count_kv", 1, u32),
        ("rope.scaling.type", "yarn", st), ("rope.scaling.factor", float(s["yarn_factor"]), f32),
        ("rope.scaling.original_context_length", s["yarn_orig_ctx"], u32), ("rope.scaling.yarn_beta_fast", 32.0, f32),
        ("rope.scaling.yarn_beta_slow", 1.0, f32), ("rope.freq_base", float(s["rope_base"]), f32),
        ("attention.layer_norm_rms_epsilon", float(s["eps"]), f32), ("expert_count", s["experts"], u32),
        ("expert_used_count", s["used"], u32), ("expert_group_count", 1, u32), ("expert_group_used_count", 1, u32),
        ("expert_gating_func", 1, u32),  # softmax
        ("attention.key_length", s["kv_lora"] + s["rope"], u32), ("attention.value_length", s["kv_lora"], u32),
    ]
    for key, val, vt in keys:
        w.add_key_value(f"{ARCH}.{key}", val, vt)
    w.add_key_value("general.file_type", FILE_TYPES[type_name], u32)
    keys = [("leading_dense_block_count", s["dense_layers"], u32), ("vocab_size", vocab, u32)]
    if s["q_lora"]:
        keys.append(("attention.q_lora_rank", s["q_lora"], u32))
    keys += [
        ("attention.kv_lora_rank", s["kv_lora"], u32), ("attention.key_length_mla", k_mla, u32),
        ("attention.value_length_mla", s["v_head"], u32), ("expert_feed_forward_length", s["expert_ff"], u32),
        ("expert_shared_count", s["shared"], u32), ("expert_weights_scale", 1.0, f32),
        ("rope.dimension_count", s["rope"], u32),
        # the converter writes 0.1 * mscale_all_dim (llama.cpp divides it back)
        ("rope.scaling.yarn_log_multiplier", 0.1 * float(s["yarn_mscale_all_dim"]), f32),
    ]
    for key, val, vt in keys:
        w.add_key_value(f"{ARCH}.{key}", val, vt)
    w.add_key_value("general.quantization_version", 2, u32)
    for key, vtype, etype, value in tok_keys:
        w.add_key_value(key, value, GGUFValueType(vtype), sub_type=None if etype is None else GGUFValueType(etype))

    w.write_header_to_file(out)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    largest: dict[tuple[str, int], int] = {}
    for _, shp, kind in plan:
        if kind in _BLOCKS:
            key = (kind, shp[0])
            largest[key] = max(largest.get(key, 0), _nbytes(kind, shp))
    sources: dict[tuple[str, int], _BlockSource] = {}
    for name, shp, kind in plan:
        if kind in _BLOCKS:
            key = (kind, shp[0])
            if key not in sources:
                sources[key] = _BlockSource(kind, shp[0], largest[key], rng)
            w.write_tensor_data(sources[key].take(_nbytes(kind, shp)))
        elif kind == "ones":
            w.write_tensor_data(np.ones(shp, np.float32))
        else:  # router: ggml {n_embd, n_expert} = numpy (n_expert, n_embd); scores well separated
            w.write_tensor_data(rng.standard_normal(shp[::-1], dtype=np.float32) * np.float32(4 / math.sqrt(shp[0])))
    w.close()
    return out


def kv_cache_bytes(path: str | os.PathLike) -> dict:
    """KV-cache bytes per token of context, f16: the latent cache against an expanded one."""
    from reflex_runtime.families import read_config
    from reflex_runtime.families.deepseek2.config import kv_cache_bytes_per_token
    from reflex_runtime.modelfile.gguf_file import GGUFFile

    with GGUFFile(path) as g:
        return kv_cache_bytes_per_token(read_config(g))


def _parse_set(items: list[str]) -> dict:
    from make_moe_bench import parse_shape_overrides

    return parse_shape_overrides(items, DEFAULT_SHAPE, _FLOAT_KEYS, zero_ok=("q_lora", "shared", "dense_layers"))


def main(argv: list[str] | None = None) -> int:
    from make_moe_bench import active_bytes_per_token

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output .gguf path")
    p.add_argument("--type", default="Q8_0", choices=sorted(FILE_TYPES), help="Q8_0 or Q4_K_M")
    p.add_argument("--layers", type=int, default=27)
    p.add_argument("--template", help="GGUF whose tokenizer.* keys are copied (default: llama.cpp's deepseek-llm vocab)")
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
    try:
        path = write_deepseek_bench(a.out, a.type, a.layers, a.template, a.seed, **shape)
    except ValueError as e:
        p.error(str(e))
    secs = time.perf_counter() - t0
    active = active_bytes_per_token(path)
    kv = kv_cache_bytes(path)
    print(f"{path} {path.stat().st_size / 1e9:.3f} GB in {secs:.1f} s; active bytes per token {active} "
          f"({active / 1e6:.1f} MB); KV cache bytes per token (f16): latent {kv['latent']}, "
          f"expanded {kv['expanded']} ({kv['expanded_over_latent']}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
