# Prepared in s35 (no GPU was lent: two refused starts, 271 s charged; nothing here has run on a GPU).
# The tensor-core decode attention, reflex_attn_decode_t2 / _t4 / _t8 (REFLEX_ATTN_TC=1, default 0): each warp
# walks its own keys from global memory into registers, mma.sync for q.K and P.V, no block barrier in the loop
# (docs/PERFORMANCE_NOTES.md s35). Passes the CPU emulation only. Here first:
#   python3 scripts/build_kernels.py --archs 90
#   bash scripts/gpu_bundle.sh --kernels-xz --peers-apart --skeleton F --old HEAD   (F: embedded_model_path())
# then, back to back on one warm machine (it goes back 30 s after a call):
#   NEXT=A  carry [".gpu"]: the attention's GPU tests with it (the *_tensor_cores tests, and the batch/paged ones
#           under REFLEX_ATTN_TC=1), decode by depth (bench_knobs, one process, two rounds each): the tile loop,
#           the tensor-core kernels for slices of >= 64 keys (REFLEX_ATTN_TC_MIN_KEYS' default) and for every
#           slice; tg128 through the engine against HEAD with each (decode_ab's variants)   (~7 min)
#   NEXT=P  carry [".gpu"]: ncu on reflex_attn_decode_t2 at 16,384 keys (every slice is long there) (the s34 call 5 figures: 52 us, DRAM 50%) (~3 min)
# If A shows it correct and faster at every depth: set REFLEX_ATTN_TC's default to 1 (gpu/launch.py), rebuild and
# re-bundle, then `OUT=$OUT bash scripts/gpu_run.sh quick,tests,check` (carry [".gpu"]: the full suite with it) and
# NEXT=B of results/2026-12-05-h100-s33/next-calls.sh (carry [".peers"]: issue 27's llama-bench rows).
R=/tmp/real
case "${NEXT:-A}" in
  A) mkdir -p $OUT/t $OUT/k
     OUT=$OUT/t MAKE_06B=q8_0 REFLEX_ATTN_TC=1 \
       TESTS="tests/test_gpu_kernels.py tests/test_gpu_batch.py tests/test_gpu_paged.py -k 'attention_decode or decode_attention or decode_rows_paged or fused_rope_decode'" \
       bash scripts/gpu_run.sh tests 2>&1 | grep -v "^===" | tail -6
     OUT=$OUT/k MAKE_06B=q8_0 AB_FILES="$R/qwen3-0.6b-q8_0.gguf" \
       AB_VARIANTS="tc:REFLEX_ATTN_TC=1 tc0:REFLEX_ATTN_TC=1,REFLEX_ATTN_TC_MIN_KEYS=0" KNOBS_FILES=$R/qwen3-0.6b-q8_0.gguf \
       KNOBS_TIMEOUT=300 KNOBS="default;attn_tc=true;attn_tc=true,attn_tc_min_keys=0;default;attn_tc=true;attn_tc=true,attn_tc_min_keys=0" \
       KNOBS_ARGS="--tokens 128 --depths 1024,4096,8192,16384" bash scripts/gpu_run.sh decode_ab,knobs 2>&1 | grep -v "^===" | tail -12 ;;
  P) Q8=$R/qwen3-0.6b-q8_0.gguf
     MAKE_06B=q8_0 OUT=$OUT bash scripts/gpu_run.sh smoke 2>&1 | tail -3
     export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 REFLEX_ATTN_TC=1
     timeout 300 ncu --clock-control none --cache-control none --graph-profiling node --profile-from-start off --csv --page details \
       --kernel-name regex:reflex_attn_decode --launch-count 3 \
       --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
       --section SchedulerStats --section InstructionStats \
       --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
       python3 results/2026-12-05-h200-s34/attn_at_depth.py $Q8 16384 > $OUT/ncu-tc-16k.csv 2> $OUT/ncu-tc-16k.err
     echo "ncu rc $?"; python3 scripts/ncu_summary.py $OUT/ncu-tc-16k.csv --json $OUT/ncu-tc-16k.json | tail -8 ;;
esac
