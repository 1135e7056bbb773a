"""Greedy text of reflex and llama.cpp's llama-simple on the same GGUF file and prompt (issue 31:
"greedy output equal to llama.cpp's on the full-size file for 32 tokens").

    python3 scripts/greedy_vs_llama.py FILE --llama-simple PATH [-n 32] [--prompt TEXT] [--out JSON]

llama-simple decodes greedily and prints the prompt and its continuation on stdout; reflex runs
`generate -t 0` on the GPU. Both stop at the model's end-of-generation token. Prints one line
(equal or not, the common prefix in characters) and writes both texts as JSON. On random-weight
files a near-tie between the top two logits may go either way in two engines with different
roundings (llama.cpp quantizes activations to 8 bits in its prompt GEMMs): the JSON keeps both
texts so a divergence can be looked at, not just counted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

PROMPT = "The history of the city begins"


def llama_simple(exe: str, path: str, prompt: str, n: int) -> str:
    out = subprocess.run([exe, "-m", path, "-n", str(n), "-ngl", "99", prompt], capture_output=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"llama-simple failed ({out.returncode}): {out.stderr.decode(errors='replace')[-400:]}")
    text = out.stdout.decode("utf-8", errors="replace")
    # it echoes the prompt (as its tokens decode) before the continuation
    return text[len(prompt):] if text.startswith(prompt) else text


def reflex(path: str, prompt: str, n: int) -> str:
    out = subprocess.run([sys.executable, "-m", "reflex_runtime.cli", "generate", prompt, "-m", path, "-n", str(n),
                          "-t", "0", "--backend", "cuda", "--json"], capture_output=True, timeout=600,
                         env=dict(os.environ))
    if out.returncode != 0:
        raise SystemExit(f"reflex generate failed ({out.returncode}): {out.stderr.decode(errors='replace')[-400:]}")
    return json.loads(out.stdout)["text"]


def common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--llama-simple", required=True)
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    ours, theirs = reflex(a.model, a.prompt, a.n), llama_simple(a.llama_simple, a.model, a.prompt, a.n)
    same = ours == theirs
    res = {"model": os.path.basename(a.model), "prompt": a.prompt, "tokens": a.n, "equal": same,
           "common_prefix_chars": common_prefix(ours, theirs), "reflex": ours, "llama_cpp": theirs}
    print(f"{res['model']:40s} greedy {a.n} tokens: {'EQUAL' if same else 'DIFFERENT'}"
          f" (common prefix {res['common_prefix_chars']} of {len(ours)} / {len(theirs)} characters)")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
