# s24 call 3 (gpu_bundle.sh --kernels-xz; carry .gpu; tree = main 9060e53): is the decode attention's time at a
# short context the grid's empty slices? bench_knobs on the 0.6B Q8_0 with fewer slices per KV head
# (attn_blocks_per_sm: grid y 66 -> 16, 8, 4), the role breakdown at a 64-token context, decode after 8 tokens.
R=/tmp/real
OUT=$OUT/a MAKE_06B=q8_0 KNOBS_FILES=$R/qwen3-0.6b-q8_0.gguf \
  KNOBS="default;attn_blocks_per_sm=1.0;attn_blocks_per_sm=0.5;attn_blocks_per_sm=0.25;attn_blocks_per_sm=0.5,attn_head_groups=1" \
  KNOBS_ARGS="--context 64 --depths 8" bash scripts/gpu_run.sh knobs 2>&1 | grep -v "^===" | tail -8
