# s26 call 2 (gpu_bundle.sh --skeleton gemma-3-270m-q4_k_m.gguf; carry .gpu and reflex_runtime/_kernels): x read
# into shared memory once a block in the staged matrix kernels (REFLEX_MVS_SHARE_X, Launcher.mvs_share_x), the
# quick GPU tier, then A/B in one process per file (bench_knobs, two interleaved rounds) with two attention knobs
# beside it, at 1,024 and 16,384 tokens of context too.
R=/tmp/real
OUT=$OUT KNOBS_FILES="$R/qwen3-0.6b-q8_0.gguf $R/qwen3-0.6b-q4_k_m.gguf $R/gemma-3-270m-q4_k_m-shaped.gguf" \
  KNOBS="default;mvs_share_x=false;attn_min_keys=64;attn_blocks_per_sm=3.0;default;mvs_share_x=false;attn_min_keys=64;attn_blocks_per_sm=3.0" \
  KNOBS_ARGS="--depths 1024,16384 --tokens 64 --repeats 3" KNOBS_TIMEOUT=200 \
  bash scripts/gpu_run.sh quick,knobs 2>&1 | grep -v "^===" | tail -40
