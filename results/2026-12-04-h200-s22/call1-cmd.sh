# s22 call 1 (gpu_bundle.sh --kernels-xz; carry .gpu): the whole GPU suite on this tree (rope.cu's per-token angles
# and warp-per-head groups; the Qwen3.5 shared expert as slot k of the routed decode launches; their new tests)
OUT=$OUT TEST_TIMEOUT=560 bash scripts/gpu_run.sh tests 2>&1 | grep -v "^===" | tail -40
