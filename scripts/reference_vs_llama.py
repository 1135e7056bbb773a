"""llama.cpp's log-probs against the numpy reference, position by position, on one GGUF file (issue 31:
telling apart where reflex and llama.cpp disagree, without a GPU).

    python3 scripts/reference_vs_llama.py FILE --llama-server PATH [-n 32] [--dequantize PAT ...]
        [--activations8] [--prompt-path]

llama-server (127.0.0.1; a CPU build works: cmake -B build -DLLAMA_CURL=OFF in the vendored llama.cpp of
the pinned llama-cpp-python sdist, `--target llama-server`) decodes greedily from reflex's prompt ids with
its top-8 log-probs; the reference replays llama.cpp's tokens (teacher-forced) and each position prints the
largest |log-prob difference| over llama.cpp's top 8 and whether the argmax agrees.
--dequantize PAT: first write a copy of FILE with the tensors whose name contains PAT (any; "" for all
quantized ones) stored as F32, the same values (llama.cpp then runs its F32 path on them).
--activations8: the reference rounds every product's input to 8-bit blocks of 32 (Q8_0, llama.cpp's
activation quantization for Q8_0 weights) as well, to see how far that alone moves the file.
--prompt-path: llama-server also gets each position's context as a prompt (its tokens evaluated
together): each line adds that path's distance from the reference and from llama.cpp's own decode.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def dequantized_copy(src: str, dst: str, patterns: list[str]) -> int:
    """dst = src with the quantized tensors matching any pattern stored as F32; returns how many."""
    import gguf
    from quantize_gguf import SourceGGUF, copy_metadata

    source = SourceGGUF(src)
    w = gguf.GGUFWriter(dst, source.get("general.architecture").decode())
    copy_metadata(source, w, int(source.get("general.file_type", 0)))
    n = 0
    plain = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
    for name, shape, type_id, offset in source.tensors:
        t, raw = gguf.GGMLQuantizationType(type_id), source.tensor_bytes(shape, type_id, offset)
        if t not in plain and any(p in name for p in patterns):
            w.add_tensor(name, gguf.quants.dequantize(raw, t).astype(np.float32).reshape(tuple(reversed(shape))))
            n += 1
        else:  # the bytes as they are, in numpy order (the last axis in bytes)
            w.add_tensor(name, raw.reshape(tuple(reversed(shape[1:])) + (raw.shape[1],)), raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return n


def _activations8(x: np.ndarray) -> np.ndarray:
    """x through Q8_0 blocks of 32 (gguf-py's quantizer, as llama.cpp rounds a Q8_0 product's input)."""
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize, quantize

    return dequantize(quantize(np.asarray(x, np.float32), Q.Q8_0), Q.Q8_0).reshape(x.shape)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("--dequantize", nargs="*", default=None)
    ap.add_argument("--activations8", action="store_true")
    ap.add_argument("--prompt-path", action="store_true")
    a = ap.parse_args(argv)
    import greedy_vs_llama as G
    from reflex_runtime.errors import ReflexError
    from reflex_runtime.families import load_reference
    from reflex_runtime.loader import load_engine
    from reflex_runtime.reference import layers

    try:
        path = a.model
        if a.dequantize is not None:
            path = os.path.join(tempfile.mkdtemp(), "dequantized.gguf")
            print(f"{dequantized_copy(a.model, path, a.dequantize)} tensors stored as F32 in {path}")
        ids = load_engine(path, backend="cpu").prompt_ids(G.PROMPT)
        theirs = G.llama_server_greedy(a.llama_server, path, G.PROMPT, ids, a.n, extra=("-fa", "off"),
                                       prompt_path=a.prompt_path)
    except (ReflexError, OSError, RuntimeError, KeyError, ValueError) as e:  # ... or an answer it cannot read
        print(f"reference_vs_llama: {e!r}" if isinstance(e, KeyError) else f"reference_vs_llama: {e}", file=sys.stderr)
        return 1
    if a.activations8:
        lin = layers.linear
        layers.linear = lambda x, w: lin(_activations8(x), w) if x.shape[-1] % 32 == 0 else lin(x, w)
    ref = load_reference(path)
    toks = ids + theirs["tokens"][:-1]
    rows = ref.forward(toks, ref.new_cache(len(toks) + 4))[len(ids) - 1:]
    worst, differ, worst_prompt = 0.0, 0, 0.0
    for j, (row, step) in enumerate(zip(rows, theirs["steps"])):
        lp = row - (row.max() + np.log(np.exp(row - row.max()).sum()))
        d = G.common_gap({t: float(lp[t]) for t in step}, step)
        same = int(row.argmax()) == theirs["tokens"][j]
        worst, differ = max(worst, d), differ + (not same)
        more = ""
        if a.prompt_path:  # llama.cpp's prompt path against the reference and against its own decode
            pro = theirs["prompt_steps"][j]
            dp, dd = G.common_gap({t: float(lp[t]) for t in pro}, pro), G.common_gap(step, pro)
            worst_prompt = max(worst_prompt, dp)
            more = f"; llama's prompt path: {dp:.4f} from the reference, " + (
                f"{dd:.4f} from its decode" if dd is not None else "no top-8 token in common with its decode")
        print(f"{j:3d} llama {theirs['tokens'][j]:7d} reference {int(row.argmax()):7d} {'same' if same else 'DIFFER'}"
              f"  max |log-prob diff| over llama's top 8: {d:.4f}{more}")
    print(f"{os.path.basename(a.model)}: argmax differs at {differ} of {len(rows)}; largest |log-prob diff| {worst:.4f}"
          + (f"; llama's prompt path at most {worst_prompt:.4f} from the reference" if a.prompt_path else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
