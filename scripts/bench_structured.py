#!/usr/bin/env python3
"""Decode speed with and without logprobs and a JSON-schema constraint, on the GPU (a benchmark).

    python scripts/bench_structured.py --model FILE.gguf --out results/DATE-GPU/structured.json [--tokens 256] [--runs 5]

Four modes on the same warm engine, interleaved run by run: plain greedy (the graph-replayed
loop), logprobs=5, a JSON schema (an array of >= 128 strings, so every run decodes >= 128 tokens
whatever the weights), and both (gpu/constrained.py). Prints and saves each mode's median decode tok/s (the
request record's decode_tokens_per_s) and tokens generated, with the date and GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# An array of at least MIN_ITEMS short strings: whatever a random-weight model prefers, every item
# costs at least one token, so a constrained run decodes >= MIN_ITEMS tokens (a schema whose output
# ends after ~11 tokens, as this one's did before, times little beyond the first token).
MIN_ITEMS = 128
SCHEMA = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string", "maxLength": 16},
                                                     "minItems": MIN_ITEMS}},
          "required": ["items"], "additionalProperties": False}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--backend", default="cuda", help="cpu: a smoke run of the script itself")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    from reflex_runtime.engine import Finished, GenerateRequest
    from reflex_runtime.text.grammar import Grammar
    from reflex_runtime.loader import load_engine
    from reflex_runtime.sampling import SamplingParams

    eng = load_engine(a.model, a.backend)
    getattr(eng.runner, "wait_weights", lambda: None)()  # warm figures: every expert resident (the CPU runner has none)
    grammar = Grammar.json_schema(SCHEMA, "schema")
    modes = {"plain": {}, "logprobs5": {"logprobs": 5}, "json_schema": {"grammar": grammar},
             "json_schema_logprobs5": {"grammar": grammar, "logprobs": 5}}
    prompt = "Write a JSON object with a list of at least 128 words:"
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for r in range(a.runs + 1):  # the first round warms graphs, the vocabulary view and caches
        for mode, extra in modes.items():
            req = GenerateRequest(prompt=prompt, max_tokens=a.tokens, sampling=SamplingParams(), ignore_eos=True, **extra)
            rec = [ev for ev in eng.generate(req) if isinstance(ev, Finished)][0].record
            if r:
                runs[mode].append({"decode_tok_s": rec["decode_tokens_per_s"], "tokens": rec["generated_tokens"]})
    out = {"date": datetime.date.today().isoformat(), "gpu": eng.runner.info().get("device"),
           "model": os.path.basename(a.model), "max_tokens": a.tokens, "runs": a.runs,
           "modes": {m: {"median_decode_tok_s": statistics.median(x["decode_tok_s"] or 0 for x in v),
                         "tokens": [x["tokens"] for x in v], "all": v} for m, v in runs.items()},
           "command": "python scripts/bench_structured.py " + " ".join(sys.argv[1:])}
    base = out["modes"]["plain"]["median_decode_tok_s"]
    for m, v in out["modes"].items():
        v["vs_plain"] = round(v["median_decode_tok_s"] / base, 3) if base else None
        print(f"{m:24s} {v['median_decode_tok_s']:9.1f} tok/s  x{v['vs_plain']}  tokens {v['tokens']}")
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
