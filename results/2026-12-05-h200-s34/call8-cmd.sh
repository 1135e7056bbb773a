# s34 call 8 (carry [".gpu"], bundle as call 6): the landed defaults (reflex_attn_decode_g2 / _g4, 5 blocks an SM
# capped by the driver's occupancy for the kernel): the quick GPU tier, tg128 against daf59aa (decode_ab, 3
# interleaved rounds), and decode at depth with the group kernels off and on (bench_knobs, one process).
R=/tmp/real; G=$R/gemma-3-270m-q4_k_m-shaped.gguf
OUT=$OUT MAKE_06B=q8_0 QUICK_TIMEOUT=150 AB_FILES="$R/qwen3-0.6b-q8_0.gguf $G" AB_VARIANTS="nog:REFLEX_ATTN_GROUP_KERNELS=0" \
  KNOBS_FILES="$R/qwen3-0.6b-q8_0.gguf" KNOBS_TIMEOUT=120 KNOBS="default;attn_group_kernels=false;default" \
  KNOBS_ARGS="--tokens 128 --depths 1024,4096,8192,16384" bash scripts/gpu_run.sh quick,decode_ab,knobs 2>&1 | grep -v "^===" | tail -9
