"""How far the numpy reference's own log-probs move under llama.cpp-like roundings (s27, issue 31).

    PYTHONPATH=. python3 results/2026-12-04-cpu-s27/reference_sensitivity.py Q8_0.gguf [F32.gguf]

Teacher-forced on the Q8_0 reference's own 32 greedy tokens after greedy_vs_llama's prompt: per position,
max |log-prob difference| over the Q8_0 reference's top 8 against (a) the Q8_0 reference with every
product's input rounded to Q8_0 blocks (reference_vs_llama.py --activations8's rounding) and, given an F32
file of the same model (the converter's), (b) the reference on it; and whether the argmax moves."""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import greedy_vs_llama as G  # noqa: E402
from reference_vs_llama import _activations8  # noqa: E402

from reflex_runtime.families import load_reference  # noqa: E402
from reflex_runtime.loader import load_engine  # noqa: E402
from reflex_runtime.reference import layers  # noqa: E402

q8, f32, n = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else None), 32
ids = load_engine(q8, backend="cpu").prompt_ids(G.PROMPT)
ref = load_reference(q8)
cache = ref.new_cache(len(ids) + n + 4)
out, gen = ref.forward(list(ids), cache), []
for _ in range(n):
    gen.append(int(out[-1].argmax()))
    out = ref.forward([gen[-1]], cache)
toks = ids + gen[:-1]


def rows(path):
    r = load_reference(path)
    return r.forward(toks, r.new_cache(len(toks) + 4))[len(ids) - 1:]


def lp(r):
    return r - (r.max() + np.log(np.exp(r - r.max()).sum()))


A = rows(q8)
B = rows(f32) if f32 else None
lin = layers.linear
layers.linear = lambda x, w: lin(_activations8(x), w) if x.shape[-1] % 32 == 0 else lin(x, w)
C = rows(q8)
layers.linear = lin
worst = {"8-bit inputs": 0.0, "F32 weights": 0.0}
flips = {k: 0 for k in worst}
for j in range(n):
    a = lp(A[j])
    top = np.argsort(-a)[:8]
    line = f"{j:3d} token {gen[j]:6d}"
    for name, other in (("8-bit inputs", C), ("F32 weights", B)):
        if other is None:
            continue
        o = lp(other[j])
        d = float(np.abs(a[top] - o[top]).max())
        worst[name] = max(worst[name], d)
        flips[name] += int(a.argmax() != o.argmax())
        line += f"  |Q8_0 - {name}| {d:.4f}{' (argmax moves)' if a.argmax() != o.argmax() else ''}"
    print(line)
print("largest: " + ", ".join(f"{k} {worst[k]:.4f} (argmax moves at {flips[k]} of {n})"
                              for k in worst if k == "8-bit inputs" or B is not None))
