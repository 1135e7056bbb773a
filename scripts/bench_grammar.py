#!/usr/bin/env python3
"""What structured output costs on the host (a benchmark, not a test; no GPU needed).

    python scripts/bench_grammar.py --out results/DATE-HOST/grammar.json [--model FILE.gguf] [--runs 10]

1. `import llguidance` in a fresh interpreter, --runs times (the first structured request pays it;
   a request without response_format or forced tools never imports it).
2. Building llguidance's view of the model's vocabulary (once per process, on the first
   structured request).
3. The per-token mask (grammar.Constraint.fill_mask): JSON-schema documents fed token by token,
   each mask timed; the GPU waits for it only where it takes longer than the decode forward it
   runs beside (gpu/constrained.py).
4. With outlines-core importable (`pip install outlines-core`, not a reflex dependency): the
   same schema through it (vocabulary, per-schema index, per-token allowed list), for the choice.
   xgrammar was not measured: it requires torch.
Default model: the tiny Qwen3 fixture, which carries the real Qwen3 vocabulary (151,669 tokens).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags", "address"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
                         "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
                         "address": {"type": "object", "required": ["city", "zip"],
                                     "properties": {"city": {"type": "string"}, "zip": {"type": "string"}}}}}
DOCS = [{"name": "Ada Lovelace", "age": 36, "tags": ["math", "engines"], "address": {"city": "London", "zip": "W1"}},
        {"name": "Grace Hopper", "age": 85, "tags": ["cobol", "navy", "compilers"],
         "address": {"city": "Arlington", "zip": "22201"}},
        {"name": "Émile Zola", "age": 62, "tags": [], "address": {"city": "Paris", "zip": "75009"}}]


def import_seconds(runs: int) -> list[float]:
    code = "import time; t = time.perf_counter(); import llguidance; print(time.perf_counter() - t)"
    return [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
            for _ in range(runs)]


def outlines_core_figures(tok) -> dict | None:
    try:
        from outlines_core import Guide, Index, Vocabulary
        from outlines_core.json_schema import build_regex_from_schema
    except ImportError:
        return None
    t = time.perf_counter()
    pieces: dict[str, list[int]] = {}
    for i in range(tok.vocab_size):
        if tok.is_special(i):
            continue
        try:  # outlines-core takes str keys: tokens that are partial UTF-8 are left out here
            pieces.setdefault(tok.token_bytes(i).decode("utf-8"), []).append(i)
        except UnicodeDecodeError:
            continue
    vocab = Vocabulary(tok.eos_id, pieces)
    vocab_s = time.perf_counter() - t
    t = time.perf_counter()
    index = Index(build_regex_from_schema(json.dumps(SCHEMA)), vocab)
    index_s = time.perf_counter() - t
    times = []
    for doc in DOCS[:2]:
        guide = Guide(index)
        for tid in tok.encode(json.dumps(doc, separators=(",", ":")), add_special=False):
            t = time.perf_counter()
            guide.get_tokens()
            times.append((time.perf_counter() - t) * 1e6)
            guide.advance(tid)
    return {"vocabulary_build_ms": round(vocab_s * 1e3, 1), "schema_index_build_ms": round(index_s * 1e3, 1),
            "allowed_tokens_us_per_token": {"mean": round(statistics.fmean(times), 1), "p50": round(pct(times, 0.5), 1),
                                            "p99": round(pct(times, 0.99), 1), "tokens": len(times)}}


def pct(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a GGUF file whose tokenizer to use (default: the tiny Qwen3 fixture)")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    from reflex_runtime.modelfile.gguf_file import GGUFFile
    from reflex_runtime.text.tokenizer import Tokenizer

    if a.model is None:
        from fixtures import make_fixture

        a.model = str(make_fixture("qwen3", "q8_0").gguf)
    imports = import_seconds(a.runs)
    g = GGUFFile(a.model)
    tok = Tokenizer.from_gguf(g)
    from reflex_runtime.families import read_config

    vocab = read_config(g).vocab_size  # rows of the output matrix: the mask covers them all

    from reflex_runtime.text import grammar

    t = time.perf_counter()
    grammar.lltokenizer(tok, vocab)
    build_s = time.perf_counter() - t

    spec = grammar.Grammar.json_schema(SCHEMA, "schema")
    words = grammar.mask_words(vocab)
    buf = (ctypes.c_uint32 * words)()
    masks_us, compile_ms = [], []
    for _ in range(a.runs):
        for doc in DOCS:
            t = time.perf_counter()
            c = spec.constraint(tok, vocab, frozenset([tok.eos_id]))
            compile_ms.append((time.perf_counter() - t) * 1e3)
            for tid in tok.encode(json.dumps(doc, ensure_ascii=False), add_special=False):
                t = time.perf_counter()
                assert c.fill_mask(ctypes.addressof(buf), ctypes.sizeof(buf))
                masks_us.append((time.perf_counter() - t) * 1e6)
                assert buf[tid >> 5] >> (tid & 31) & 1, "the document's own token must be allowed"
                c.accept(tid)
    out = {
        "date": datetime.date.today().isoformat(), "host": platform.node(), "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(), "model": os.path.basename(a.model), "vocab": vocab,
        "import_llguidance_ms": {"median": round(statistics.median(imports) * 1e3, 2),
                                 "min": round(min(imports) * 1e3, 2), "runs": len(imports)},
        "vocabulary_view_build_ms": round(build_s * 1e3, 1),
        "schema_compile_ms": {"median": round(statistics.median(compile_ms), 3), "p99": round(pct(compile_ms, 0.99), 3)},
        "mask_us_per_token": {"mean": round(statistics.fmean(masks_us), 1), "p50": round(pct(masks_us, 0.5), 1),
                              "p99": round(pct(masks_us, 0.99), 1), "max": round(max(masks_us), 1),
                              "tokens": len(masks_us)},
        "outlines_core": outlines_core_figures(tok),
        "command": "python scripts/bench_grammar.py " + " ".join(sys.argv[1:]),
    }
    print(json.dumps(out, indent=2))
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
