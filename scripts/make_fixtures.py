#!/usr/bin/env python3
"""Tiny random `transformers` models converted to GGUF by llama.cpp's own converter.

The tests compare our numpy reference (and later the GPU engine) with `transformers` on the
same random model. To make sure our GGUF conventions are the ones real files use, the GGUF is
written by llama.cpp's UNMODIFIED `convert_hf_to_gguf.py` from the pinned sdist
(scripts/llama_cpp_sdist.py), run in a subprocess. Types the converter cannot write (Q4_0,
Q4_1, Q5_0, Q5_1, K-quants, the Q4_K_M mix) are made from the f32 GGUF by scripts/quantize_gguf.py.

The code is the fixtures package (scripts/fixtures/); this is its command line.

    make_fixture("qwen3", "q8_0", seed=0, num_hidden_layers=3) -> FixturePaths(hf_dir, gguf)

is cached under $REFLEX_TEST_CACHE (default ~/.cache/reflex-runtime/test)/fixtures/, keyed by
(arch, overrides, seed, outtype, converter version, fixtures/common.py's FIXTURE_VERSION), so re-runs
are instant and parallel test processes build each fixture once (file lock).

CLI (also used offline on the GPU machine to make real-sized files with random weights):

    python scripts/make_fixtures.py qwen3 --outtype q8_0 --out DIR [--set hidden_size=1024 ...]
    python scripts/make_fixtures.py --preset qwen3-0.6b --outtype q8_0 --out DIR
    python scripts/make_fixtures.py gemma3 --outtype q4_k_m          # into the cache; prints paths
    python scripts/make_fixtures.py --prune                          # drop stale cache entries

Nothing here needs the network once the sdist is cached (the converter runs with
HF_HUB_OFFLINE=1).
"""

import sys

from fixtures.build import main

if __name__ == "__main__":
    sys.exit(main())
