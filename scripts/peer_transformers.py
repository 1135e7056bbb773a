#!/usr/bin/env python3
"""Peer for bench_coldstart.py: transformers + torch, one greedy token from a cold process.

    python scripts/peer_transformers.py HF_DIR [PROMPT]

Prints the generated token text to stdout as soon as it exists (the benchmark's "first token").
"""

import sys


def main() -> int:
    hf_dir = sys.argv[1]
    prompt = sys.argv[2] if len(sys.argv) > 2 else "The capital of France is"
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.bfloat16).to("cuda")
    ids = tok(prompt, return_tensors="pt").input_ids.to("cuda")
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=1, do_sample=False)
    sys.stdout.write(tok.decode(out[0, ids.shape[1]:]) or "?")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
