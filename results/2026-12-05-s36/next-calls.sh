# Prepared in s36 (one H100 call ran: results/2026-12-05-s36/README.md). Here first:
#   python3 scripts/build_kernels.py --archs 90
#   bash scripts/gpu_bundle.sh --kernels-xz --peers-apart --skeleton F --old 42e62c9   (F: embedded_model_path())
# then, back to back on one warm machine (it goes back 30 s after a call):
#   NEXT=A  carry [".gpu"]: the attention's GPU tests on the tensor-core kernels (loads one group ahead); decode by
#           depth (bench_knobs, one process, two rounds): the tile kernels, the tensor-core ones from 1,024 keys
#           (REFLEX_ATTN_TC_FROM's default), and in every graph; 42e62c9's tensor-core loop by depth   (~3 min)
#   NEXT=P  carry [".gpu"]: ncu on reflex_attn_decode_t2 at 16,384 keys (s36 call 1b: 58 us in 2.02 waves)   (~1 min)
# If A shows the tensor-core kernels faster at 1,024 keys and beyond: set REFLEX_ATTN_TC's default to 1
# (gpu/launch.py; tests/test_launch_abi.py asserts the default), rebuild and re-bundle, then
# `OUT=$OUT bash scripts/gpu_run.sh quick,tests,check` (carry [".gpu"]) and NEXT=B of
# results/2026-12-05-h100-s33/next-calls.sh (carry [".peers"]: issue 27's llama-bench rows).
R=/tmp/real
case "${NEXT:-A}" in
  A) bash results/2026-12-05-s36/call3-cmd.sh ;;
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
