# s34 call 7 (carry [".gpu"], as call 6, on the same warm machine): tg128 of this tree against daf59aa with five
# blocks an SM and with the general kernel (decode_ab, 3 interleaved rounds), and decode at depth (bench_knobs).
R=/tmp/real; G=$R/gemma-3-270m-q4_k_m-shaped.gguf; mkdir -p $OUT/c
OUT=$OUT/c MAKE_06B=q8_0 AB_FILES="$R/qwen3-0.6b-q8_0.gguf $G" AB_VARIANTS="bps5:REFLEX_ATTN_BLOCKS_PER_SM=5 nog:REFLEX_ATTN_GROUP_KERNELS=0" \
  KNOBS_FILES="$R/qwen3-0.6b-q8_0.gguf" KNOBS_TIMEOUT=150 KNOBS="attn_group_kernels=false;default;attn_blocks_per_sm=5;attn_group_kernels=false" \
  KNOBS_ARGS="--tokens 128 --depths 1024,8192,16384" bash scripts/gpu_run.sh decode_ab,knobs 2>&1 | grep -v "^===" | tail -12
