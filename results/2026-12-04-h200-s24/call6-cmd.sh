# s24 call 6 (gpu_bundle.sh --old 9060e53 --kernels-xz; carry .gpu): call 5's tree, and the one-token matrix kernels
# (mvs.cuh) copy each block's weight tile with one TMA bulk copy (stage.cuh rx_bulk_*) instead of a 16-byte cp.async
# per thread and chunk. The quick GPU tier, then decode tok/s of this tree and 9060e53 interleaved on the 0.6B Q8_0
# and Q4_K_M files.
R=/tmp/real
OUT=$OUT/q bash scripts/gpu_run.sh quick 2>&1 | grep -v "^===" | grep "quick tier\|FAILED\|ERROR\|kernel files" | tail -12
OUT=$OUT/a AB_FILES="$R/qwen3-0.6b-q8_0.gguf $R/qwen3-0.6b-q4_k_m.gguf" bash scripts/gpu_run.sh decode_ab 2>&1 | grep "decode_ab "
