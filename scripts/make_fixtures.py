#!/usr/bin/env python3
"""The command line of the test fixtures: tiny random `transformers` models converted to GGUF by
llama.cpp's own converter (the fixtures package, scripts/fixtures/; fixtures/build.py says how
they are made and cached under $REFLEX_TEST_CACHE/fixtures/).

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
