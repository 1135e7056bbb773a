# s24 call 7 (gpu_bundle.sh --old 9060e53 --kernels-xz; carry .gpu): the final tree (the decode attention reads its
# q/k norm weights before its wait and the new value with q; calls 5-6's L2 prefetch and bulk copies left out):
# the whole GPU suite, then decode tok/s of this tree and 9060e53 interleaved on the 0.6B Q8_0.
R=/tmp/real
OUT=$OUT/t TEST_TIMEOUT=400 bash scripts/gpu_run.sh tests 2>&1 | grep -v "^===" | tail -12
OUT=$OUT/a MAKE_06B=q8_0 bash scripts/gpu_run.sh decode_ab 2>&1 | grep "decode_ab "
