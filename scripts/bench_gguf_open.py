#!/usr/bin/env python3
"""Time opening a GGUF with reflex_runtime.modelfile.gguf_file against gguf.GGUFReader, in fresh processes.

    python scripts/bench_gguf_open.py [FILE ...]     (default: llama.cpp's Qwen2 test vocabulary, 151,936 tokens)

Each figure is the best of --runs fresh interpreters and includes the module import.
"""

import argparse
import json
import subprocess
import sys

OURS = "import time; t=time.perf_counter(); from reflex_runtime.modelfile.gguf_file import GGUFFile; g=GGUFFile({p!r}); print(time.perf_counter()-t)"
THEIRS = "import time; t=time.perf_counter(); import gguf; r=gguf.GGUFReader({p!r}); print(time.perf_counter()-t)"


def best(code: str, runs: int) -> float:
    return min(float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
               for _ in range(runs))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    files = args.files
    if not files:
        sys.path.insert(0, __file__.rsplit("/", 1)[0])
        from llama_cpp_sdist import llama_cpp_dir

        files = [str(llama_cpp_dir() / "models" / "ggml-vocab-qwen2.gguf")]
    for p in files:
        ours, theirs = best(OURS.format(p=p), args.runs), best(THEIRS.format(p=p), args.runs)
        print(json.dumps({"file": p, "reflex_gguf_file_s": round(ours, 4), "gguf_GGUFReader_s": round(theirs, 3),
                          "speedup": round(theirs / ours, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
