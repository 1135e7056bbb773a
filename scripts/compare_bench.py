#!/usr/bin/env python3
"""compare.json rows (../shared/RESULTS.md) from one run's `reflex bench --out` JSON and
`llama-bench -o json` output on the same file: tg128, tg128@dN and ppN, each with both engines'
tok/s and the ratio (reflex / llama.cpp).

    python scripts/compare_bench.py --file qwen3-0.6b-q8_0 --reflex bench-qwen3-0.6b-q8_0.json \
        --llama llama-bench-qwen3-0.6b-q8_0.json [--llama more.json] --out compare.json [--commit REV]

Only the figures both engines measured become rows; the rest is printed as unmatched.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_json import row, write_compare  # noqa: E402


def reflex_figures(bench: dict) -> dict[str, float]:
    """metric -> tok/s from a reflex bench JSON."""
    out = {}
    dec = bench.get("decode") or {}
    if dec.get("tok_s_median"):
        out[f"tg{dec.get('tokens', 128)}"] = float(dec["tok_s_median"])
    for d in bench.get("decode_at_depth") or []:
        if d.get("tok_s"):
            out[f"tg{d['tokens']}@d{d['depth']}"] = float(d["tok_s"])
    for p in bench.get("prefill") or []:
        if p.get("tok_s"):
            out[f"pp{p['tokens']}"] = float(p["tok_s"])
    return out


def llama_figures(rows: list[dict]) -> dict[str, float]:
    """metric -> tok/s from llama-bench's JSON rows (a prompt row: ppN; a generation row: tgN, @dN
    when it ran after a context of n_depth tokens)."""
    out = {}
    for r in rows:
        depth = int(r.get("n_depth") or 0)
        if r.get("n_prompt") and not r.get("n_gen"):
            key = f"pp{r['n_prompt']}" + (f"@d{depth}" if depth else "")
        elif r.get("n_gen") and not r.get("n_prompt"):
            key = f"tg{r['n_gen']}" + (f"@d{depth}" if depth else "")
        else:
            continue
        out[key] = float(r["avg_ts"])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--file", required=True, help="the rows' file name (RESULTS.md's naming, no .gguf)")
    p.add_argument("--reflex", required=True, help="reflex bench --out JSON")
    p.add_argument("--llama", action="append", required=True, help="llama-bench -o json output (repeatable)")
    p.add_argument("--out", required=True, help="compare.json to merge the rows into")
    p.add_argument("--commit")
    args = p.parse_args(argv)
    bench = json.loads(Path(args.reflex).read_text())
    ours = reflex_figures(bench)
    peer: dict[str, float] = {}
    for f in args.llama:
        peer.update(llama_figures(json.loads(Path(f).read_text())))
    rows = [row(args.file, m, round(ours[m], 1), round(peer[m], 1), rate=True) for m in ours if m in peer]
    for r in rows:
        print(f"{r['file']:<34} {r['metric']:<14} reflex {r['reflex']:>10.1f}  llama.cpp {r['llama_cpp']:>10.1f}  "
              f"ratio {r['ratio']:.3f}")
    unmatched = sorted((set(ours) | set(peer)) - {r["metric"] for r in rows})
    if unmatched:
        print("unmatched:", ", ".join(unmatched))
    if rows:
        write_compare(Path(args.out), rows, bench.get("device"), args.commit)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
