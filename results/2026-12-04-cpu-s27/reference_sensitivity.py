"""How far the numpy reference's own log-probs move under llama.cpp-like roundings (s27, issue 31).

    PYTHONPATH=. python3 results/2026-12-04-cpu-s27/reference_sensitivity.py DIR F32.gguf Q8_0.gguf

Teacher-forced on the Q8_0 reference's own 32 greedy tokens after greedy_vs_llama's prompt: per position,
max |log-prob difference| over the Q8_0 reference's top 8 against (a) the same weights as F32 (the
converter's F32 file) and (b) the Q8_0 reference with every product's input rounded to Q8_0 blocks
(reference_vs_llama.py --activations8's rounding)."""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import greedy_vs_llama as G  # noqa: E402
from reference_vs_llama import _activations8  # noqa: E402

from reflex_runtime.families import load_reference  # noqa: E402
from reflex_runtime.loader import load_engine  # noqa: E402
from reflex_runtime.reference import layers  # noqa: E402

d, f32, q8, n = sys.argv[1], sys.argv[2], sys.argv[3], 32
ids = load_engine(f"{d}/{f32}", backend="cpu").prompt_ids(G.PROMPT)


def rows(path, toks):
    ref = load_reference(path)
    return ref.forward(toks, ref.new_cache(len(toks) + 4))[len(ids) - 1:]


def lp(r):
    return r - (r.max() + np.log(np.exp(r - r.max()).sum()))


ref = load_reference(f"{d}/{q8}")
cache = ref.new_cache(len(ids) + n + 4)
out, gen = ref.forward(list(ids), cache), []
for _ in range(n):
    gen.append(int(out[-1].argmax()))
    out = ref.forward([gen[-1]], cache)
toks = ids + gen[:-1]
A, B = rows(f"{d}/{q8}", toks), rows(f"{d}/{f32}", toks)
lin = layers.linear
layers.linear = lambda x, w: lin(_activations8(x), w) if x.shape[-1] % 32 == 0 else lin(x, w)
C = rows(f"{d}/{q8}", toks)
layers.linear = lin
worst_f32 = worst_a8 = 0.0
for j in range(n):
    a, b, c = lp(A[j]), lp(B[j]), lp(C[j])
    top = np.argsort(-a)[:8]
    df, da = float(np.abs(a[top] - b[top]).max()), float(np.abs(a[top] - c[top]).max())
    worst_f32, worst_a8 = max(worst_f32, df), max(worst_a8, da)
    print(f"{j:3d} token {gen[j]:6d}  |Q8_0 - F32| {df:.4f}  |Q8_0 - Q8_0 with 8-bit inputs| {da:.4f}")
print(f"largest: F32 weights {worst_f32:.4f}, 8-bit inputs {worst_a8:.4f}")
