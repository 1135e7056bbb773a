# s24 call 1 (gpu_bundle.sh --old 9060e53 --kernels-xz; carry .gpu): the quick GPU tier on this tree (kernels that
# let their successor in before they wait: mvs.cuh's dense bodies, attn_decode), then decode tok/s of this tree
# against 9060e53 interleaved on the 0.6B Q8_0 and Q4_K_M files, then bench_knobs on the Q8_0 (breakdown at a
# 64-token context, pure-graph decode after 8 tokens) for smaller weight budgets and attention slices.
R=/tmp/real
OUT=$OUT/q bash scripts/gpu_run.sh quick 2>&1 | grep -v "^===" | tail -25
OUT=$OUT/a AB_FILES="$R/qwen3-0.6b-q8_0.gguf $R/qwen3-0.6b-q4_k_m.gguf" KNOBS_FILES=$R/qwen3-0.6b-q8_0.gguf \
  KNOBS="default;mvs_budget=65536;mvs_budget=49152;attn_min_keys=64;attn_min_keys=128;attn_min_keys=16" \
  KNOBS_ARGS="--context 64 --depths 8" bash scripts/gpu_run.sh decode_ab,knobs 2>&1 | grep -v "^===" | tail -20
