# s34 call 6 (carry [".gpu"], gpu_bundle.sh --kernels-xz --peers-apart --skeleton F --old daf59aa): the decode
# attention instantiated for groups of <= 2 / <= 4 query heads (reflex_attn_decode_g2 / _g4: 95 / 80 registers
# against 125, the rope scratch in the second K tile: five blocks an SM fit). The quick GPU tier; decode tok/s and
# the step's roles at a 5-token prompt and at 4,096 / 16,384 tokens of context per knob setting (one process per
# file, bench_knobs.py); cold start against daf59aa (the fatbin 4.75 -> 4.87 MB).
R=/tmp/real; G=$R/gemma-3-270m-q4_k_m-shaped.gguf
mkdir -p $OUT/a $OUT/b
OUT=$OUT/a MAKE_06B=q8_0 KNOBS_FILES="$R/qwen3-0.6b-q8_0.gguf $G" KNOBS_TIMEOUT=200 \
  KNOBS="default;attn_group_kernels=false;attn_blocks_per_sm=5;attn_blocks_per_sm=6;attn_group_kernels=false,attn_blocks_per_sm=5" \
  KNOBS_ARGS="--tokens 128 --depths 4096,16384" bash scripts/gpu_run.sh quick,knobs 2>&1 | grep -v "^===" | tail -16
OUT=$OUT/b MAKE_06B=q8_0 RUNS=10 COLD_TIMEOUT=150 bash scripts/gpu_run.sh coldstart_ab 2>&1 | grep -E "warm first|per round" | tail -6
