# s18 call 5 (same tree as call 2): the whole GPU suite (gpu_bundle.sh --kernels-xz: llguidance for the constrained tests)
OUT=$OUT TEST_TIMEOUT=560 bash scripts/gpu_run.sh tests 2>&1 | grep -v "^===" | tail -30
