# s26 call 3 (gpu_bundle.sh --skeleton gemma-3-270m-q4_k_m.gguf; carry .gpu and reflex_runtime/_kernels): the decode
# attention with three K / V tiles (two in flight; REFLEX_ATTN_STAGES, Launcher.attn_stages) beside x in shared memory;
# the quick GPU tier (its attention tests now at 2 and 3 stages), then A/B in one process per file (bench_knobs, two
# interleaved rounds) at 1,024, 4,096 and 16,384 tokens of context.
R=/tmp/real
OUT=$OUT MAKE_06B=q8_0 KNOBS_FILES="$R/qwen3-0.6b-q8_0.gguf $R/gemma-3-270m-q4_k_m-shaped.gguf" \
  KNOBS="default;attn_stages=2;attn_blocks_per_sm=3.0;attn_stages=2,mvs_share_x=false;default;attn_stages=2;attn_blocks_per_sm=3.0;attn_stages=2,mvs_share_x=false" \
  KNOBS_ARGS="--depths 1024,4096,16384 --tokens 64 --repeats 3" KNOBS_TIMEOUT=240 \
  bash scripts/gpu_run.sh quick,knobs 2>&1 | grep -v "^===" | tail -30
