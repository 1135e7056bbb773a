#!/usr/bin/env python3
"""Write a Qwen3.5-shaped GGUF (architecture qwen35 or qwen35moe) with random weights in Q8_0 or
llama-quantize's Q4_K_M mix, for GPU benchmarks on machines with no network.

    python scripts/make_qwen35_bench.py --model 0.8b --type q8_0 --out /tmp/q35/qwen35-0.8b-q8_0.gguf
    python scripts/make_qwen35_bench.py --model 35b-a3b --type q4_k_m --out /tmp/q35/qwen35moe-35b-a3b-q4_k_m.gguf
        [--layers N] [--template T.gguf] [--seed 0] [--set hidden=1024 ...]

Shapes. The Hugging Face config.json files of Qwen/Qwen3.5-0.8B and Qwen/Qwen3.5-35B-A3B could
not be fetched from here; the values below are the published text configs as copied, in agreement,
by these public sources:
  Qwen3.5-0.8B (the smallest Qwen3.5): hidden 1024, 24 layers (3 Gated DeltaNet + 1 gated
    attention, x6), FFN 3584, attention 8 heads / 2 KV heads of 256 with rotary on 64 dims (partial
    0.25, base 1e7), linear attention 16 key / 16 value heads of 128, conv 4, vocab 248320, tied
    embeddings, context 262144, RMS eps 1e-6: github.com/THUDM/slime scripts/models/qwen3.5-0.8B.sh
    (Megatron arguments), and text configs written out in public code that loads that checkpoint
    (e.g. a `QWEN35_08B_TEXT_CONFIG` dict: "linear_num_key_heads": 16, "linear_num_value_heads": 16,
    "linear_key_head_dim": 128, "mtp_num_hidden_layers": 1; a mini-SGLang test asserting the same).
  Qwen3.5-35B-A3B: hidden 2048, 40 layers (10 x (3 DeltaNet + 1 attention)), attention 16 heads /
    2 KV heads of 256 (rotary 0.25 of it, base 1e7), linear attention 16 key / 32 value heads of
    128, conv 4, 256 experts (8 routed, softmax) of FFN 512 + one shared expert of 512 with a
    sigmoid gate, vocab 248320, untied LM head: github.com/THUDM/slime
    scripts/models/qwen3.5-35B-A3B.sh, and the model card's table as quoted in public write-ups.
The multi-token-prediction block the checkpoints carry is not written (as the converter's
--no-nextn does): neither llama.cpp nor reflex reads it for plain generation.

Why not transformers + llama.cpp's converter: at 35B parameters that means 70 GB of bf16 weights
and a long quantization pass. Here the quantized blocks are made directly: one pool of random
valid blocks per (type, row length), tiled to the largest tensor that needs it, and every tensor
a slice of it at a random block offset. Weights have std about 0.5/sqrt(row length):
  Q8_0  d * q, q uniform in [-127, 127]
  Q4_K  d * q - dmin, every sub-block scale and min 1, q uniform in [0, 15], dmin = 7.5 d
  Q6_K  d * (q - 32), every sub-block scale 1, q uniform in [0, 63]
Norms are F32 ones; the routers (ffn_gate_inp, ffn_gate_inp_shexp) and the Gated DeltaNet conv
stay F32 as llama-quantize keeps them; ssm_a = -exp(N(0, 0.5)), ssm_dt.bias ~ N(0, 0.5).

The file mirrors what convert_hf_to_gguf.py (--no-nextn) writes for these architectures (checked
against the tiny converter-made fixtures by tests/test_qwen35_bench_file.py): the same general.* /
qwen35*.* keys in the same order and value types, the tokenizer.* keys of --template (default: the
tiny qwen35 fixture, i.e. the real Qwen3 tokenizer) with the token list padded to the vocabulary
with "[PAD<id>]" tokens of type UNUSED (as the converter pads), the same tensor names, shapes and
order. Tensor types for --type q4_k_m follow llama-quantize's Q4_K_M rules for these tensors (the
pinned llama.cpp's src/llama-quant.cpp): Q6_K for the LM head (the tied embedding), for attn_v and
attn_qkv (its "attention-v-like" class, counted in file order: one per layer) and every ffn_down*
in the "more bits" layers (first and last eighth, every third in between); Q4_K otherwise.
Checked on 2026-11-30 with that llama.cpp built for the CPU: the 0.8b files (Q8_0, Q4_K_M) and
4-layer 35b-a3b files load and generate in llama-simple, and llama-quantize --allow-requantize of
the Q8_0 files to Q4_K_M picks exactly this script's type for every tensor.

Sizes: 0.8b about 1.0 GB (Q8_0) / 0.6 GB (Q4_K_M); 35b-a3b about 37 GB / 21 GB.

Library use: write_qwen35_bench(out, model="0.8b", qtype="q8_0", layers=None, template=None,
seed=0, **shape) -> Path; tensor_plan(shape, layers, qtype) -> [(name, ggml shape, type)].
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))

MODELS = {
    "0.8b": dict(arch="qwen35", hidden=1024, layers=24, ff=3584, heads=8, kv_heads=2, head_dim=256, rope_dim=64,
                 k_heads=16, v_heads=16, k_dim=128, v_dim=128, conv=4, vocab=248320, tied=1, context=262144,
                 rope_base=1e7, eps=1e-6, interval=4, experts=0, used=0, expert_ff=0, shared_ff=0),
    "35b-a3b": dict(arch="qwen35moe", hidden=2048, layers=40, ff=0, heads=16, kv_heads=2, head_dim=256, rope_dim=64,
                    k_heads=16, v_heads=32, k_dim=128, v_dim=128, conv=4, vocab=248320, tied=0, context=262144,
                    rope_base=1e7, eps=1e-6, interval=4, experts=256, used=8, expert_ff=512, shared_ff=512),
}
_FLOAT_KEYS = ("rope_base", "eps")
ROPE_SECTIONS = [11, 11, 10, 0]  # mrope_section [11, 11, 10] (text: every section sees one position)
TYPES = {"q8_0": 7, "q4_k_m": 15}  # --type -> llama_ftype (general.file_type)

# block layout per ggml type: (values per block, bytes per block)
_BLOCK = {"Q8_0": (32, 34), "Q4_K": (256, 144), "Q6_K": (256, 210), "Q5_0": (32, 22)}
_GGML_ID = {"F32": 0, "Q5_0": 6, "Q8_0": 8, "Q4_K": 12, "Q6_K": 14}
_POOL_BLOCKS = {"Q8_0": 131071, "Q4_K": 16381, "Q6_K": 16381, "Q5_0": 131071}  # primes: rows start all over the pool
_UNUSED = 5  # llama_token_type UNUSED, as the converter marks its [PAD] tokens


def _more_bits(layer: int, n_layers: int) -> bool:
    """llama-quantize's use_more_bits: the first and last eighth of the layers, every third in between."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def q4_k_m_type(name: str, shape: tuple[int, ...], n_layers: int, tied: bool) -> str:
    """llama-quantize's Q4_K_M choice for a quantizable Qwen3.5 tensor (see the module docstring)."""
    m = re.match(r"blk\.(\d+)\.", name)
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        want = "Q6_K"
    elif m and (name.endswith((".attn_v.weight", ".attn_qkv.weight")) or ".ffn_down" in name) \
            and _more_bits(int(m.group(1)), n_layers):
        want = "Q6_K"
    else:
        want = "Q4_K"
    if shape[0] % 256 == 0:
        return want
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        return "Q8_0"
    return {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}[want]  # llama.cpp's fallback for rows that are not 256s


def tensor_plan(s: dict, layers: int, qtype: str) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, ggml shape, type) in the converter's order; type "F32" or a quantized ggml type."""
    e, hd = s["hidden"], s["head_dim"]
    key_dim, value_dim = s["k_heads"] * s["k_dim"], s["v_heads"] * s["v_dim"]
    channels = 2 * key_dim + value_dim
    moe = s["arch"] == "qwen35moe"
    plan: list[tuple[str, tuple[int, ...], str | None]] = []  # None: quantized
    if not s["tied"]:
        plan.append(("output.weight", (e, s["vocab"]), None))
    plan.append(("token_embd.weight", (e, s["vocab"]), None))
    for il in range(layers):
        b = f"blk.{il}."
        recurrent = (il + 1) % s["interval"] != 0
        plan.append((b + "attn_norm.weight", (e,), "F32"))
        if recurrent:
            plan += [(b + "ssm_a", (s["v_heads"],), "F32"), (b + "ssm_conv1d.weight", (s["conv"], channels), "F32"),
                     (b + "ssm_dt.bias", (s["v_heads"],), "F32"), (b + "ssm_alpha.weight", (e, s["v_heads"]), None),
                     (b + "ssm_beta.weight", (e, s["v_heads"]), None), (b + "attn_qkv.weight", (e, channels), None),
                     (b + "attn_gate.weight", (e, value_dim), None), (b + "ssm_norm.weight", (s["v_dim"],), "F32"),
                     (b + "ssm_out.weight", (value_dim, e), None)]
        if moe:
            f, n_exp, fs = s["expert_ff"], s["experts"], s["shared_ff"]
            plan += [(b + "ffn_down_exps.weight", (f, e, n_exp), None), (b + "ffn_gate_exps.weight", (e, f, n_exp), None),
                     (b + "ffn_up_exps.weight", (e, f, n_exp), None), (b + "ffn_gate_inp.weight", (e, n_exp), "F32"),
                     (b + "ffn_down_shexp.weight", (fs, e), None), (b + "ffn_gate_shexp.weight", (e, fs), None),
                     (b + "ffn_up_shexp.weight", (e, fs), None), (b + "ffn_gate_inp_shexp.weight", (e, 1), "F32")]
        else:
            plan += [(b + "ffn_down.weight", (s["ff"], e), None), (b + "ffn_gate.weight", (e, s["ff"]), None),
                     (b + "ffn_up.weight", (e, s["ff"]), None)]
        plan.append((b + "post_attention_norm.weight", (e,), "F32"))
        if not recurrent:
            plan += [(b + "attn_k_norm.weight", (hd,), "F32"), (b + "attn_k.weight", (e, s["kv_heads"] * hd), None),
                     (b + "attn_output.weight", (s["heads"] * hd, e), None), (b + "attn_q_norm.weight", (hd,), "F32"),
                     (b + "attn_q.weight", (e, 2 * s["heads"] * hd), None),
                     (b + "attn_v.weight", (e, s["kv_heads"] * hd), None)]
    plan.append(("output_norm.weight", (e,), "F32"))
    out = []
    for name, shape, t in plan:
        if t is None:
            t = "Q8_0" if qtype == "q8_0" else q4_k_m_type(name, shape, layers, bool(s["tied"]))
        out.append((name, shape, t))
    return out


def _nbytes(shape: tuple[int, ...], t: str) -> int:
    if t == "F32":
        return 4 * math.prod(shape)
    per, size = _BLOCK[t]
    return math.prod(shape) // per * size


def _random_blocks(t: str, k: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """n random valid blocks of type t whose weights have std about 0.5 / sqrt(k)."""
    per, size = _BLOCK[t]
    target = 0.5 / math.sqrt(k)
    blocks = np.empty((n, size), np.uint8)
    if t == "Q8_0":  # f16 d | 32 int8
        d = target / math.sqrt((255 ** 2 - 1) / 12)
        blocks[:, :2] = np.float16(d).reshape(1, 1).view(np.uint8).reshape(1, 2)
        blocks[:, 2:] = rng.integers(-127, 128, size=(n, 32), dtype=np.int8).view(np.uint8)
    elif t == "Q5_0":  # f16 d | 4 bytes high bits | 16 bytes low nibbles; value d * (q - 16), q 5 bits
        d = target / math.sqrt((32 ** 2 - 1) / 12)
        blocks[:, :2] = np.float16(d).reshape(1, 1).view(np.uint8).reshape(1, 2)
        blocks[:, 2:] = rng.integers(0, 256, size=(n, 20), dtype=np.uint8)
    elif t == "Q4_K":  # f16 d | f16 dmin | 12 scale bytes | 128 bytes of nibbles
        d = target / math.sqrt((16 ** 2 - 1) / 12)
        blocks[:, 0:2] = np.float16(d).reshape(1, 1).view(np.uint8).reshape(1, 2)
        blocks[:, 2:4] = np.float16(7.5 * d).reshape(1, 1).view(np.uint8).reshape(1, 2)
        blocks[:, 4:8] = 1  # scales 0-3 (bits 6-7: the high bits of scales 4-7, zero)
        blocks[:, 8:12] = 1  # mins 0-3
        blocks[:, 12:16] = 0x11  # scales and mins 4-7 (low nibbles)
        blocks[:, 16:] = rng.integers(0, 256, size=(n, 128), dtype=np.uint8)
    elif t == "Q6_K":  # 128 bytes low nibbles | 64 bytes high bits | 16 int8 scales | f16 d
        d = target / math.sqrt((64 ** 2 - 1) / 12)
        blocks[:, :192] = rng.integers(0, 256, size=(n, 192), dtype=np.uint8)
        blocks[:, 192:208] = 1
        blocks[:, 208:210] = np.float16(d).reshape(1, 1).view(np.uint8).reshape(1, 2)
    else:
        raise ValueError(t)
    return blocks


class _BlockSource:
    """Random bytes of one (type, row length) for every tensor that needs them: slices of one
    periodic buffer at random block offsets."""

    def __init__(self, t: str, k: int, max_nbytes: int, rng: np.random.Generator):
        pool = _random_blocks(t, k, _POOL_BLOCKS[t], rng)
        self.block = pool.shape[1]
        self.buf = np.resize(pool.reshape(-1), max_nbytes + pool.nbytes)
        self.n_pool, self.rng = pool.shape[0], rng

    def take(self, nbytes: int) -> np.ndarray:
        off = int(self.rng.integers(self.n_pool)) * self.block
        return self.buf[off:off + nbytes]


def default_template() -> Path:
    """The tiny converter-made qwen35 Q8_0 fixture (its tokenizer is the real Qwen3 one)."""
    from fixtures import make_fixture

    return Path(make_fixture("qwen35", "q8_0").gguf)


def _tokenizer_keys(template, vocab: int) -> list:
    """The template's tokenizer.* keys, tokens and token types padded to `vocab` ([PAD<id>], UNUSED)."""
    from quantize_gguf import SourceGGUF  # exact value types, raw string bytes

    keys = [list(m) for m in SourceGGUF(template).metadata if m[0].startswith("tokenizer.")]
    by_name = {m[0]: m for m in keys}
    if "tokenizer.ggml.tokens" not in by_name:
        raise SystemExit(f"template {template} has no tokenizer.ggml.tokens")
    tokens = list(by_name["tokenizer.ggml.tokens"][3])
    if vocab < len(tokens):
        raise ValueError(f"vocab {vocab} is smaller than the template's {len(tokens)} tokens")
    pad = range(len(tokens), vocab)
    by_name["tokenizer.ggml.tokens"][3] = tokens + [f"[PAD{i}]".encode() for i in pad]
    if "tokenizer.ggml.token_type" in by_name:
        by_name["tokenizer.ggml.token_type"][3] = list(by_name["tokenizer.ggml.token_type"][3]) + [_UNUSED] * len(pad)
    return keys


def write_qwen35_bench(out: str | os.PathLike, model: str = "0.8b", qtype: str = "q8_0", layers: int | None = None,
                       template: str | os.PathLike | None = None, seed: int = 0, **shape) -> Path:
    """Write the file; shape keys as MODELS[model] (unknown keys raise). Returns the path."""
    import gguf
    from gguf import GGMLQuantizationType, GGUFValueType

    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(MODELS)}")
    if qtype not in TYPES:
        raise ValueError(f"unknown type {qtype!r}; known: {', '.join(TYPES)}")
    bad = set(shape) - set(MODELS[model])
    if bad:
        raise ValueError(f"unknown shape keys {sorted(bad)}; known: {sorted(MODELS[model])}")
    s = {**MODELS[model], **shape}
    layers = s["layers"] if layers is None else layers
    arch, moe = s["arch"], s["arch"] == "qwen35moe"
    for key in ("hidden", "ff", "expert_ff", "shared_ff"):
        if s[key] % 32:
            raise ValueError(f"{key}={s[key]} must be a multiple of 32 (quantized rows)")
    if (s["heads"] * s["head_dim"]) % 32 or (s["v_heads"] * s["v_dim"]) % 32 or s["v_heads"] % s["k_heads"]:
        raise ValueError(f"bad shape {s}")
    tok_keys = _tokenizer_keys(template if template is not None else default_template(), s["vocab"])
    plan = tensor_plan(s, layers, qtype)

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(out, arch)  # general.architecture first, as the converter's file has it
    for name, shp, t in plan:
        np_shape = tuple(reversed(shp))  # numpy order: ggml shape[0] is the last (contiguous) axis
        if t == "F32":
            w.add_tensor_info(name, np_shape, np.dtype(np.float32), _nbytes(shp, t))
        else:  # byte shape: the last numpy axis counts bytes (gguf-py's raw convention)
            per, size = _BLOCK[t]
            byte_shape = (*np_shape[:-1], np_shape[-1] // per * size)
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), _nbytes(shp, t),
                              raw_dtype=GGMLQuantizationType(_GGML_ID[t]))

    # Keys in the order convert_hf_to_gguf.py --no-nextn writes them for qwen35 / qwen35moe.
    u32, f32, i32, b = GGUFValueType.UINT32, GGUFValueType.FLOAT32, GGUFValueType.INT32, GGUFValueType.BOOL
    w.add_type("model")
    w.add_name(f"{arch} bench (random {qtype.upper()}, {layers} layer{'' if layers == 1 else 's'})")
    w.add_size_label(gguf.size_label(*w.get_total_parameter_count()))
    keys = [("block_count", layers, u32), ("context_length", s["context"], u32), ("embedding_length", s["hidden"], u32)]
    if not moe:
        keys.append(("feed_forward_length", s["ff"], u32))
    keys += [("attention.head_count", s["heads"], u32), ("attention.head_count_kv", s["kv_heads"], u32)]
    for key, val, vt in keys:
        w.add_key_value(f"{arch}.{key}", val, vt)
    w.add_key_value(f"{arch}.rope.dimension_sections", ROPE_SECTIONS, GGUFValueType.ARRAY, sub_type=i32)
    w.add_key_value(f"{arch}.rope.freq_base", float(s["rope_base"]), f32)
    w.add_key_value(f"{arch}.attention.layer_norm_rms_epsilon", float(s["eps"]), f32)
    if moe:
        w.add_key_value(f"{arch}.expert_count", s["experts"], u32)
        w.add_key_value(f"{arch}.expert_used_count", s["used"], u32)
    w.add_key_value(f"{arch}.attention.key_length", s["head_dim"], u32)
    w.add_key_value(f"{arch}.attention.value_length", s["head_dim"], u32)
    w.add_key_value("general.file_type", TYPES[qtype], u32)
    if moe:
        w.add_key_value(f"{arch}.expert_feed_forward_length", s["expert_ff"], u32)
        w.add_key_value(f"{arch}.expert_shared_feed_forward_length", s["shared_ff"], u32)
    for key, val in (("ssm.conv_kernel", s["conv"]), ("ssm.state_size", s["k_dim"]), ("ssm.group_count", s["k_heads"]),
                     ("ssm.time_step_rank", s["v_heads"]), ("ssm.inner_size", s["v_heads"] * s["v_dim"])):
        w.add_key_value(f"{arch}.{key}", val, u32)
    recurrent = [(il + 1) % s["interval"] != 0 for il in range(layers)]
    w.add_key_value(f"{arch}.attention.recurrent_layers", recurrent, GGUFValueType.ARRAY, sub_type=b)
    w.add_key_value(f"{arch}.full_attention_interval", s["interval"], u32)
    w.add_key_value(f"{arch}.rope.dimension_count", s["rope_dim"], u32)
    w.add_key_value("general.quantization_version", 2, u32)
    for key, vtype, etype, value in tok_keys:
        w.add_key_value(key, value, GGUFValueType(vtype), sub_type=None if etype is None else GGUFValueType(etype))

    w.write_header_to_file(out)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    sources: dict[tuple[str, int], _BlockSource] = {}
    largest: dict[tuple[str, int], int] = {}
    for _, shp, t in plan:
        if t != "F32":
            largest[(t, shp[0])] = max(largest.get((t, shp[0]), 0), _nbytes(shp, t))
    for name, shp, t in plan:
        if t != "F32":
            key = (t, shp[0])
            if key not in sources:
                sources[key] = _BlockSource(t, shp[0], largest[key], rng)
            w.write_tensor_data(sources[key].take(_nbytes(shp, t)))
            continue
        np_shape = shp[::-1]
        if name.endswith(".ssm_a"):
            data = -np.exp(rng.standard_normal(np_shape, dtype=np.float32) * np.float32(0.5))
        elif name.endswith((".ssm_dt.bias", ".ssm_conv1d.weight")):
            data = rng.standard_normal(np_shape, dtype=np.float32) * np.float32(0.5)
        elif name.endswith("ffn_gate_inp.weight"):  # the router: scores well separated
            data = rng.standard_normal(np_shape, dtype=np.float32) * np.float32(4 / math.sqrt(s["hidden"]))
        elif name.endswith("ffn_gate_inp_shexp.weight"):
            data = rng.standard_normal(np_shape, dtype=np.float32) * np.float32(1 / math.sqrt(s["hidden"]))
        else:  # norms
            data = np.ones(np_shape, np.float32)
        w.write_tensor_data(np.ascontiguousarray(data, dtype=np.float32))
    w.close()
    return out


def _parse_set(items: list[str], model: str) -> dict:
    from make_moe_bench import parse_shape_overrides

    return parse_shape_overrides(items, [k for k in MODELS[model] if k != "arch"], _FLOAT_KEYS,
                                 zero_ok=("tied", "experts", "used", "expert_ff", "shared_ff", "ff"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output .gguf path")
    p.add_argument("--model", choices=sorted(MODELS), default="0.8b")
    p.add_argument("--type", choices=sorted(TYPES), default="q8_0", dest="qtype")
    p.add_argument("--layers", type=int, help="layers to write (default: the model's)")
    p.add_argument("--template", help="GGUF whose tokenizer.* keys are copied (default: the tiny qwen35 fixture)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="shape override, e.g. hidden=2048")
    a = p.parse_args(argv)
    if a.layers is not None and a.layers < 1:
        p.error(f"--layers must be at least 1; got {a.layers}")
    try:
        shape = _parse_set(a.set, a.model)
    except ValueError as e:
        p.error(str(e))
    t0 = time.perf_counter()
    try:
        path = write_qwen35_bench(a.out, a.model, a.qtype, a.layers, a.template, a.seed, **shape)
    except ValueError as e:
        p.error(str(e))
    secs = time.perf_counter() - t0
    from make_moe_bench import active_bytes_per_token

    active = active_bytes_per_token(path)
    print(f"{path} {path.stat().st_size / 1e9:.3f} GB in {secs:.1f} s; "
          f"active bytes per token {active} ({active / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
