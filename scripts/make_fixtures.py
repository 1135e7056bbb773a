#!/usr/bin/env python3
"""Tiny random `transformers` models converted to GGUF by llama.cpp's own converter.

The tests compare our numpy reference (and later the GPU engine) with `transformers` on the
same random model. To make sure our GGUF conventions are the ones real files use, the GGUF is
written by llama.cpp's UNMODIFIED `convert_hf_to_gguf.py` from the pinned sdist
(scripts/llama_cpp_sdist.py), run in a subprocess. Types the converter cannot write (Q4_0,
Q4_1, Q5_0, Q5_1, K-quants, the Q4_K_M mix) are made from the f32 GGUF by scripts/quantize_gguf.py.

Adding an architecture is one function: `build_<arch>(overrides, hf_dir) -> ArchBuild` that
returns the `transformers` config and writes/lists the tokenizer files, plus one line in ARCHS.

    make_fixture("qwen3", "q8_0", seed=0, num_hidden_layers=3) -> FixturePaths(hf_dir, gguf)

is cached under $REFLEX_TEST_CACHE (default ~/.cache/reflex-runtime/test)/fixtures/, keyed by
(arch, overrides, seed, outtype, converter version, this file's FIXTURE_VERSION), so re-runs
are instant and parallel test processes build each fixture once (file lock).

CLI (also used offline on the GPU machine to make real-sized files with random weights):

    python scripts/make_fixtures.py qwen3 --outtype q8_0 --out DIR [--set hidden_size=1024 ...]
    python scripts/make_fixtures.py --preset qwen3-0.6b --outtype q8_0 --out DIR
    python scripts/make_fixtures.py gemma3 --outtype q4_k_m          # into the cache; prints paths
    python scripts/make_fixtures.py --prune                          # drop stale cache entries

Nothing here needs the network once the sdist is cached (the converter runs with
HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))

from llama_cpp_sdist import VERSION as LLAMA_CPP_VERSION  # noqa: E402
from llama_cpp_sdist import cache_dir, llama_cpp_dir  # noqa: E402

# Bump when a builder, the weight init or the cache layout changes: old cache entries are ignored.
FIXTURE_VERSION = 2

# Output types the converter writes itself; the rest come from quantize_gguf.py applied to f32.
CONVERTER_TYPES = ("f32", "f16", "bf16", "q8_0")


@dataclass
class ArchBuild:
    """What a builder returns: the HF config, and how to initialise the random weights."""

    config: Any  # transformers PretrainedConfig
    # Value the RMSNorm weights are drawn around: 1.0 for x*w norms; 0.0 for Gemma's x*(1+w).
    norm_center: float = 1.0
    emb_std: float = 0.02


@dataclass(frozen=True)
class FixturePaths:
    hf_dir: Path  # save_pretrained() folder: config.json, model.safetensors, tokenizer files
    gguf: Path


# -- tokenizers -----------------------------------------------------------------------------


def qwen3_tokenizer_dir() -> Path:
    """The real Qwen3 tokenizer (tokenizer.json + tokenizer_config.json)."""
    candidates = [os.environ.get("REFLEX_QWEN3_TOKENIZER", "")]
    for base in (_HERE.parent, *_HERE.parents):
        candidates.append(str(base / "shared" / "data" / "qwen3-tokenizer"))
    candidates.append("/work/shared/data/qwen3-tokenizer")
    for c in candidates:
        if c and (Path(c) / "tokenizer.json").is_file():
            return Path(c)
    raise FileNotFoundError(
        "Qwen3 tokenizer not found: set REFLEX_QWEN3_TOKENIZER to a folder with tokenizer.json "
        "and tokenizer_config.json (e.g. shared/data/qwen3-tokenizer)"
    )


# A small corpus for the Gemma-style SentencePiece model: plain English, digits, punctuation,
# code and a few non-ASCII words so byte fallback and multi-byte pieces both occur.
_CORPUS = """\
The capital of France is Paris, and the capital of Italy is Rome.
Berlin is the capital of Germany; Madrid is the capital of Spain.
A quick brown fox jumps over the lazy dog while the cat sleeps in the sun.
Serverless functions start cold, load a model, and answer one request at a time.
The first token should arrive quickly: measure the time from process start to first token.
Quantized weights stay in blocks of thirty-two or two hundred fifty-six values.
Each block keeps a scale and a few bits per weight, which saves memory and bandwidth.
In 2024 the model answered 1234 questions in 56.7 seconds, about 21.8 per second.
def forward(x): return x * 2 + 1  # a tiny function
for i in range(10): print(i, i ** 2)
She said: "Hello, world!" and he replied, 'Good morning.'
Numbers like 3.14159, 2.71828 and 1.41421 appear in mathematics.
The river flows through the valley, past the old mill and the stone bridge.
Weather today: sunny in the morning, rain in the afternoon, clear at night.
Café, naïve, résumé, Zürich, São Paulo, Kraków and Ångström use accents.
Chinese: 你好，世界。 Japanese: こんにちは。 Korean: 안녕하세요.
Emoji are rare in this corpus 🙂 but byte fallback covers them.
Attention layers mix information across positions; feed-forward layers transform each position.
Sliding window attention looks at the last few hundred tokens; global layers see everything.
Rotary position embeddings rotate pairs of dimensions by an angle that grows with position.
The user asked a question and the model gave a short, helpful answer.
Please write a poem about the sea, the wind, and the light on the water.
Once upon a time there was a small village at the edge of a great forest.
The children played in the garden until their mother called them in for dinner.
Scientists measured the temperature of the water every hour for three weeks.
"""


def train_spm(out_dir: Path, vocab_size: int = 512, user_symbols=("<start_of_turn>", "<end_of_turn>"),
              llama: bool = False) -> Path:
    """Train a tiny Gemma-like SentencePiece BPE model (byte fallback, split digits, no dummy
    prefix; ids 0..3 = <pad>, <eos>, <bos>, <unk> as in Gemma) and return tokenizer.model.
    llama=True: Llama 2's layout instead (a dummy prefix space; ids 0..2 = <unk>, <s>, </s>)."""
    import sentencepiece as spm

    lines = _CORPUS.splitlines()
    # Vary the corpus a little so the trainer sees each word in several contexts.
    text = "\n".join(lines + [f"{a} {b}" for a, b in zip(lines, reversed(lines))] + [ln.lower() for ln in lines])
    out_dir.mkdir(parents=True, exist_ok=True)
    corpus = out_dir / "spm_corpus.txt"
    corpus.write_text(text + "\n", encoding="utf-8")
    prefix = out_dir / "tokenizer"
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(prefix),
        model_type="bpe",
        vocab_size=vocab_size,
        hard_vocab_limit=False,
        byte_fallback=True,
        split_digits=True,
        add_dummy_prefix=llama,
        remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True,
        normalization_rule_name="identity",
        character_coverage=1.0,
        **(dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1) if llama else dict(
            pad_id=0, eos_id=1, bos_id=2, unk_id=3,
            pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>", unk_piece="<unk>")),
        user_defined_symbols=list(user_symbols),
        num_threads=1,
        minloglevel=2,
    )
    corpus.unlink()
    (out_dir / "tokenizer.vocab").unlink(missing_ok=True)
    return out_dir / "tokenizer.model"


# -- architectures ----------------------------------------------------------------------------


def _split_overrides(overrides: dict, defaults: dict) -> dict:
    kw = dict(defaults)
    kw.update(overrides)
    return kw


def build_qwen3(overrides: dict, hf_dir: Path) -> ArchBuild:
    """Qwen3 dense, shaped like Qwen3-0.6B but tiny. The converter asserts that every token id
    of the tokenizer is < vocab_size, so with the real tokenizer vocab_size must be >= 151669
    (the published models use 151936, which we keep; the embedding is made small via hidden)."""
    from transformers import Qwen3Config

    kw = _split_overrides(overrides, dict(
        vocab_size=151936,
        hidden_size=256,  # a multiple of 256 so every matrix can be K-quantized
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        bos_token_id=151643,
        eos_token_id=151645,
    ))
    kw["architectures"] = ["Qwen3ForCausalLM"]
    tok = qwen3_tokenizer_dir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tok / name, hf_dir / name)
    return ArchBuild(Qwen3Config(**kw), norm_center=1.0)


def build_gemma3(overrides: dict, hf_dir: Path) -> ArchBuild:
    """Gemma 3 text (Gemma3ForCausalLM, model_type gemma3_text), set the way the real 270M/1B
    configs are, because llama.cpp hard-codes some of it instead of reading the file:
    - 5 local : 1 global layers (llama.cpp: layer il is local iff il % 6 < 5; the converter does
      not write the pattern), so use >= 6 layers to get a global layer;
    - query scale 1/sqrt(head_dim) (llama.cpp ignores query_pre_attn_scalar), so
      query_pre_attn_scalar == head_dim;
    - local RoPE base 10000 (written as rope.freq_base_swa by this converter; older files lack
      it and llama.cpp defaults to 10000), global base 1e6, no RoPE scaling;
    - gelu_pytorch_tanh, no attention softcap (the converter asserts it), final softcap None.
    """
    from transformers import Gemma3TextConfig

    spm_vocab = int(overrides.pop("spm_vocab_size", 512))
    model = train_spm(hf_dir, spm_vocab)
    import sentencepiece as spm

    n_tokens = spm.SentencePieceProcessor(model_file=str(model)).vocab_size()
    head_dim = int(overrides.get("head_dim", 64))
    kw = _split_overrides(overrides, dict(
        vocab_size=n_tokens,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=head_dim,
        query_pre_attn_scalar=head_dim,
        sliding_window=8,  # small, so test prompts cross the window
        sliding_window_pattern=6,
        rope_theta=1_000_000.0,
        rope_local_base_freq=10_000.0,
        hidden_activation="gelu_pytorch_tanh",
        final_logit_softcapping=None,
        attn_logit_softcapping=None,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        pad_token_id=0, eos_token_id=1, bos_token_id=2,
    ))
    kw["architectures"] = ["Gemma3ForCausalLM"]
    if kw.get("sliding_window_pattern") != 6 or "layer_types" in kw:
        raise ValueError("gemma3 fixtures must keep the 5:1 local/global pattern llama.cpp hard-codes")
    if kw["query_pre_attn_scalar"] != kw["head_dim"]:
        raise ValueError("llama.cpp scales queries by 1/sqrt(head_dim): keep query_pre_attn_scalar == head_dim")
    cfg = Gemma3TextConfig(**kw)
    # As in the real Gemma 3 tokenizer_config.json: the converter turns this into
    # tokenizer.ggml.add_bos_token = true.
    (hf_dir / "tokenizer_config.json").write_text(json.dumps({
        "add_bos_token": True, "add_eos_token": False, "bos_token": "<bos>", "eos_token": "<eos>",
        "pad_token": "<pad>", "unk_token": "<unk>", "tokenizer_class": "GemmaTokenizer",
    }, indent=1))
    return ArchBuild(cfg, norm_center=0.0)


from fixtures_llama import build_llama, llama_to_hf  # noqa: E402
from fixtures_qwen3moe import build_qwen3moe  # noqa: E402

ARCHS: dict[str, Callable[[dict, Path], ArchBuild]] = {
    "qwen3": build_qwen3,
    "gemma3": build_gemma3,
    "qwen3moe": build_qwen3moe,
    "llama": build_llama,
    "qwen35": lambda overrides, hf_dir: __import__("fixtures_qwen35").build_qwen35(overrides, hf_dir),
    "qwen35moe": lambda overrides, hf_dir: __import__("fixtures_qwen35").build_qwen35moe(overrides, hf_dir),
    "deepseek_v2": lambda overrides, hf_dir: __import__("fixtures_deepseek").build_deepseek_v2(overrides, hf_dir),
    "deepseek_v3": lambda overrides, hf_dir: __import__("fixtures_deepseek").build_deepseek_v3(overrides, hf_dir),
}

# Real model shapes with random weights (for GPU timing and memory work, not for quality).
PRESETS: dict[str, tuple[str, dict]] = {
    "qwen3-0.6b": ("qwen3", dict(
        hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True,
        rope_theta=1_000_000.0, max_position_embeddings=40960,
    )),
    # SmolLM2-135M's shape (the real file is the `smollm2` short name; this one has random weights)
    "smollm2-135m": ("llama", dict(
        hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, head_dim=64, vocab_size=49152, tie_word_embeddings=True,
        rope_theta=100_000.0, rms_norm_eps=1e-5, max_position_embeddings=8192,
    )),
    "gemma3-270m": ("gemma3", dict(
        hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, sliding_window=512, max_position_embeddings=32768,
    )),
}


# -- GGUF tensors back into a transformers model ---------------------------------------------
#
# To test a quantized file against transformers, we load the HF model and overwrite each
# parameter with the dequantized GGUF tensor. Names go through gguf-py's TensorNameMap (the
# table the converter uses); what the converter did to the values is undone per architecture
# (fix(gguf_name, array, source file)). Qwen3 and Gemma 3 need no q/k permutation (only the
# llama family gets one).


def _gemma3_to_hf(gguf_name: str, arr, src=None):
    # The converter stores Gemma's RMSNorm weight w as w + 1 (Gemma3RMSNorm computes x*(1+w)).
    return arr - 1.0 if gguf_name.endswith("norm.weight") else arr


GGUF_TO_HF: dict[str, Callable[[str, Any, Any], Any]] = {
    "gemma3": _gemma3_to_hf,
    "llama": llama_to_hf,
}
# Tensors the converter derives from the config that transformers recomputes itself.
DERIVED_TENSORS = frozenset({"rope_freqs.weight"})


def hf_model_from_gguf(gguf_path: str | os.PathLike, config_or_dir):
    """A float32 `transformers` model (from an HF folder, or built from a config) whose every
    parameter is the gguf-py-dequantized tensor of gguf_path. Raises if a parameter has no
    tensor or a tensor is left unused."""
    import gguf
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    if isinstance(config_or_dir, (str, os.PathLike)):
        model = AutoModelForCausalLM.from_pretrained(config_or_dir, dtype=torch.float32)
    else:
        try:  # every parameter is overwritten below: skip the (slow) random init
            from transformers.initialization import no_init_weights
        except ImportError:
            no_init_weights = contextlib.nullcontext
        with no_init_weights():
            model = AutoModelForCausalLM.from_config(config_or_dir, dtype=torch.float32)
        model.tie_weights()  # skipped along with the init
    model.eval()
    from quantize_gguf import _SourceGGUF  # fast typed reader (GGUFReader is slow on big vocabularies)

    src = _SourceGGUF(gguf_path)
    arch = src.get("general.architecture").decode()
    n_blocks = int(src.get(f"{arch}.block_count"))
    arch_id = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch]
    tmap = gguf.get_tensor_name_map(arch_id, n_blocks)
    fix = GGUF_TO_HF.get(arch, lambda name, arr, src: arr)
    tensors = {name: (shape, t, off) for name, shape, t, off in src.tensors}
    used = set()
    with torch.no_grad():
        for name, p in model.named_parameters():
            gname = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
            if gname is None or gname not in tensors:
                raise KeyError(f"no GGUF tensor for parameter {name} (mapped to {gname})")
            shape, t, off = tensors[gname]
            arr = gguf.quants.dequantize(src.tensor_bytes(shape, t, off), gguf.GGMLQuantizationType(t))
            arr = fix(gname, np.array(arr, dtype=np.float32).reshape(tuple(p.shape)), src)
            p.copy_(torch.from_numpy(arr))
            used.add(gname)
    if set(tensors) - used - DERIVED_TENSORS:
        raise KeyError(f"GGUF tensors not used by the HF model: {sorted(set(tensors) - used - DERIVED_TENSORS)}")
    return model


# -- building -------------------------------------------------------------------------------


def init_random_weights(model, seed: int, norm_center: float, emb_std: float = 0.02, gain: float = 0.8) -> None:
    """Deterministic random weights that keep activations at a sensible scale:
    embeddings (and an untied LM head) N(0, emb_std); other matrices N(0, gain / sqrt(fan_in)),
    about 0.05 at hidden 256 and 0.025 at hidden 1024 (a flat 0.02 makes tiny models ignore
    their context, and greedy decoding repeats one token); RMSNorm weights norm_center + N(0, 0.1);
    biases N(0, 0.02)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    emb_ids = {id(model.get_input_embeddings().weight)}
    out = model.get_output_embeddings()
    if out is not None:
        emb_ids.add(id(out.weight))
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if p.ndim == 1:
                p.copy_((norm_center + 0.1 * noise) if "norm" in name else 0.02 * noise)
            elif id(p) in emb_ids:
                p.copy_(emb_std * noise)
            else:
                p.copy_(gain / p.shape[-1] ** 0.5 * noise)


def build_hf(arch: str, hf_dir: Path, seed: int = 0, overrides: dict | None = None) -> ArchBuild:
    """Write a random HF model (config, safetensors, tokenizer files) into hf_dir."""
    import torch
    from transformers import AutoModelForCausalLM

    if arch not in ARCHS:
        raise KeyError(f"unknown fixture architecture '{arch}'; known: {', '.join(sorted(ARCHS))}")
    hf_dir.mkdir(parents=True, exist_ok=True)
    build = ARCHS[arch](dict(overrides or {}), hf_dir)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(build.config, dtype=torch.float32)
    init_random_weights(model, seed, build.norm_center, build.emb_std)
    model.save_pretrained(hf_dir)
    return build


def convert(hf_dir: Path, outtype: str, outfile: Path, name: str = "reflex test fixture") -> None:
    """Run llama.cpp's convert_hf_to_gguf.py (unmodified, from the pinned sdist)."""
    if outtype not in CONVERTER_TYPES:
        raise ValueError(f"the converter writes {CONVERTER_TYPES}, not {outtype}")
    script = llama_cpp_dir() / "convert_hf_to_gguf.py"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("NO_LOCAL_GGUF", None)  # the converter must use its own bundled gguf-py
    with tempfile.TemporaryDirectory() as cwd:
        r = subprocess.run(
            [sys.executable, str(script), str(hf_dir), "--outtype", outtype, "--outfile", str(outfile),
             "--model-name", name],
            cwd=cwd, env=env, capture_output=True, text=True,
        )
    if r.returncode != 0:
        tail = "\n".join((r.stdout + r.stderr).splitlines()[-30:])
        raise RuntimeError(f"convert_hf_to_gguf.py failed ({r.returncode}) on {hf_dir}:\n{tail}")


def make_gguf(hf_dir: Path, outtype: str, outfile: Path, f32_source: Path | None = None) -> None:
    """Converter types directly; the rest by requantizing an f32 GGUF (made if not given)."""
    outtype = outtype.lower()
    if outtype in CONVERTER_TYPES:
        convert(hf_dir, outtype, outfile)
        return
    import quantize_gguf

    if outtype.upper() not in quantize_gguf.SCHEMES:
        raise ValueError(f"unknown outtype '{outtype}'; use one of {CONVERTER_TYPES} or {sorted(quantize_gguf.SCHEMES)}")
    tmp = None
    if f32_source is None:
        tmp = outfile.with_name(outfile.name + ".f32.tmp")
        convert(hf_dir, "f32", tmp)
        f32_source = tmp
    try:
        quantize_gguf.quantize_file(f32_source, outfile, outtype.upper(), log=None)
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)


def _key(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


@contextlib.contextmanager
def _locked(path: Path):
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _versions() -> dict:
    from importlib.metadata import version

    import quantize_gguf

    return {"fixture": FIXTURE_VERSION, "llama.cpp": LLAMA_CPP_VERSION, "transformers": version("transformers"),
            "quantizer": quantize_gguf.QUANTIZER_VERSION}


def make_fixture(arch: str, outtype: str = "f32", seed: int = 0, **overrides) -> FixturePaths:
    """Build (or reuse from the cache) a random `arch` model and its GGUF of `outtype`."""
    outtype = outtype.lower()
    _record_use(arch, outtype, seed, overrides)
    root = cache_dir() / "fixtures"
    versions = _versions()
    hf_key = _key({"arch": arch, "seed": seed, "overrides": overrides, "v": versions["fixture"],
                   "transformers": versions["transformers"]})
    base = root / f"{arch}-{hf_key}"
    hf_dir = base / "hf"
    with _locked(root / f".{arch}-{hf_key}.lock"):
        if not (hf_dir / ".complete").exists():
            if hf_dir.exists():
                shutil.rmtree(hf_dir)
            tmp = base / f".hf-{os.getpid()}"
            if tmp.exists():
                shutil.rmtree(tmp)
            build_hf(arch, tmp, seed, overrides)
            (tmp / "fixture.json").write_text(json.dumps(
                {"arch": arch, "seed": seed, "overrides": overrides, "versions": versions}, indent=1, default=str))
            (tmp / ".complete").write_text("")
            tmp.rename(hf_dir)
        conv_key = _key({"llama.cpp": versions["llama.cpp"], "quantizer": versions["quantizer"] if outtype not in CONVERTER_TYPES else 0})
        gguf = base / f"{outtype}-{conv_key}.gguf"
        if not gguf.exists():
            tmp = gguf.with_name(f".{gguf.name}.{os.getpid()}.tmp")
            f32 = None
            if outtype not in CONVERTER_TYPES:
                f32 = _cached_f32(base, hf_dir, versions)
            make_gguf(hf_dir, outtype, tmp, f32_source=f32)
            tmp.rename(gguf)
    return FixturePaths(hf_dir, gguf)


def _record_use(arch: str, outtype: str, seed: int, overrides: dict) -> None:
    """REFLEX_RECORD_FIXTURES=FILE: one JSON line per fixture asked for, from any process
    (scripts/prebuild_fixtures.py --write makes tests/fixture_list.json from it)."""
    record = os.environ.get("REFLEX_RECORD_FIXTURES")
    if record:
        with open(record, "a") as f:
            f.write(json.dumps({"arch": arch, "outtype": outtype, "seed": seed, "overrides": overrides}, default=str) + "\n")


def _cached_f32(base: Path, hf_dir: Path, versions: dict) -> Path:
    f32 = base / f"f32-{_key({'llama.cpp': versions['llama.cpp'], 'quantizer': 0})}.gguf"
    if not f32.exists():
        tmp = f32.with_name(f".{f32.name}.{os.getpid()}.tmp")
        convert(hf_dir, "f32", tmp)
        tmp.rename(f32)
    return f32


def prune_cache() -> list[Path]:
    """Delete cached fixtures made by another FIXTURE_VERSION / llama.cpp / transformers /
    quantizer version than the current ones; returns what was removed."""
    root = cache_dir() / "fixtures"
    current = _versions()
    removed = []
    for d in sorted(root.iterdir()) if root.exists() else []:
        if not d.is_dir() or d.name.startswith("."):
            continue
        meta = d / "hf" / "fixture.json"
        try:
            versions = json.loads(meta.read_text())["versions"]
        except (OSError, ValueError, KeyError):
            versions = None
        if versions != current:
            with _locked(root / f".{d.name}.lock"):
                shutil.rmtree(d, ignore_errors=True)
            (root / f".{d.name}.lock").unlink(missing_ok=True)
            removed.append(d)
    return removed


# -- CLI --------------------------------------------------------------------------------------


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("arch", nargs="?", help=f"one of {', '.join(sorted(ARCHS))}")
    ap.add_argument("--preset", choices=sorted(PRESETS), help="a real model's shape (random weights)")
    ap.add_argument("--outtype", default="f32", help="f32, f16, bf16, q8_0 (converter) or q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k, q4_k_m")
    ap.add_argument("--out", type=Path, help="write DIR/hf and DIR/<arch>-<outtype>.gguf here instead of the cache")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field (JSON value)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-hf", action="store_true", help="with --out: delete the HF folder after converting")
    ap.add_argument("--prune", action="store_true", help="delete cached fixtures of other versions, then exit")
    args = ap.parse_args(argv)
    if args.prune:
        for d in prune_cache():
            print(f"removed {d}")
        return 0

    overrides: dict = {}
    arch = args.arch
    if args.preset:
        parch, poverrides = PRESETS[args.preset]
        if arch and arch != parch:
            ap.error(f"--preset {args.preset} is a {parch} model")
        arch = parch
        overrides.update(poverrides)
    if not arch:
        ap.error("give an architecture or --preset")
    for item in args.set:
        k, sep, v = item.partition("=")
        if not sep:
            ap.error(f"--set wants KEY=VALUE, got {item!r}")
        overrides[k.strip()] = _parse_value(v.strip())

    t0 = time.perf_counter()
    if args.out is None:
        paths = make_fixture(arch, args.outtype, args.seed, **overrides)
    else:
        out = args.out
        out.mkdir(parents=True, exist_ok=True)
        hf_dir = out / "hf"
        if hf_dir.exists():
            shutil.rmtree(hf_dir)
        build_hf(arch, hf_dir, args.seed, overrides)
        gguf = out / f"{arch}-{args.outtype.lower()}.gguf"
        make_gguf(hf_dir, args.outtype, gguf)
        if args.no_hf:
            shutil.rmtree(hf_dir)
        paths = FixturePaths(hf_dir, gguf)
    print(json.dumps({"arch": arch, "outtype": args.outtype, "hf_dir": str(paths.hf_dir), "gguf": str(paths.gguf),
                      "seconds": round(time.perf_counter() - t0, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
