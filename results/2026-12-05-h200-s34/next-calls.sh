# Prepared in s34 for the next session (not run). Issue 27's last missed depth (@d16384 1.19x / 1.18x on the 0.6B
# files, H200, call 2): the decode attention at 16,384 keys runs 8 tiles a block, and in each tile's P V half the
# block (Qwen3's 64 items for 128 threads) idles at the barrier while the other half walks all 32 keys.
# pv-split.patch: reflex_attn_decode_g2p (96 registers), P V over two threads an item (every other key each, the
# halves added once after the slice), REFLEX_ATTN_PV_SPLIT=1 (default 0) for groups of <= 2 with G * hd_v <= 256.
# Passes the CPU emulation (239 cases; leaving out one of the four sums fails 26), the ABI tests and test_mvs_host.
# Here first:
#   git apply results/2026-12-05-h200-s34/pv-split.patch && python3 scripts/build_kernels.py --archs 90
#   bash scripts/gpu_bundle.sh --kernels-xz --peers-apart --skeleton F --old HEAD   (F: embedded_model_path())
# then NEXT=A (carry [".gpu"]); if it wins at every depth, land it (default 1) and NEXT=B (carry [".peers"]) for the
# llama-bench rows of the landed tree (NEXT=B of results/2026-12-05-h100-s33/next-calls.sh, after A made the files).
R=/tmp/real
G=$R/gemma-3-270m-q4_k_m-shaped.gguf
case "${NEXT:-A}" in
  A) mkdir -p $OUT/t $OUT/k
     # the attention's GPU tests with the split on (the Launcher reads the knob when each test makes one)
     OUT=$OUT/t MAKE_06B=q8_0 REFLEX_ATTN_PV_SPLIT=1 \
       TESTS="tests/test_gpu_kernels.py tests/test_gpu_batch.py tests/test_gpu_paged.py -k 'attention_decode or decode_attention or decode_rows_paged or fused_rope_decode'" \
       bash scripts/gpu_run.sh tests 2>&1 | grep -v "^===" | tail -4
     # decode by depth with the split off and on (one process), and tg128 through the engine against HEAD
     OUT=$OUT/k MAKE_06B=q8_0 AB_FILES="$R/qwen3-0.6b-q8_0.gguf" AB_VARIANTS="pv:REFLEX_ATTN_PV_SPLIT=1" \
       KNOBS_FILES=$R/qwen3-0.6b-q8_0.gguf KNOBS="default;attn_pv_split=true;default;attn_pv_split=true" \
       KNOBS_ARGS="--tokens 128 --depths 1024,4096,8192,16384" bash scripts/gpu_run.sh decode_ab,knobs 2>&1 | grep -v "^===" | tail -6 ;;
  B) NEXT=B OUT=$OUT bash results/2026-12-05-h100-s33/next-calls.sh ;;
esac
