# s19 call 2 (call 1's tree + the prompt GEMMs' activations through cp.async into a ring, one copy-group per 32-k step;
# greedy_vs_llama.py on llama-server): quick tier, the 30B-A3B shape and the 0.6B Q8_0 / Q4_K_M vs llama-bench,
# reflex check on a 4-layer 30B-A3B-shaped file, greedy vs llama-server on the 30B file, ncu stall reasons
# of a ~520-token prefill's expert and dense GEMMs on the 30B shape
R=/tmp/real; M=$R/qwen3moe-30b-a3b-48l-q8_0.gguf; C=$R/qwen3moe-30b-a3b-4l-q8_0.gguf; Q4=$R/qwen3-0.6b-q4_k_m.gguf
Q8=$R/qwen3-0.6b-q8_0.gguf
export PREFILL=128,512,2048 PEER_P=128,512,2048 BENCH_TIMEOUT=150 GREEDY_TIMEOUT=240
P=$(python3 -c "print('The quick brown fox jumps over the lazy dog while the cat sleeps. ' * 40)")
EXTRA="timeout 150 ncu --clock-control none --csv --page details --kernel-name 'regex:moe_gemm|gemm_q8' --launch-count 8 \
 --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis \
 --section InstructionStats --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio' \
 python3 -m reflex_runtime.cli generate '$P' -n 1 --model $M --backend cuda > \$OUT/run/ncu-stall-30b.csv 2> \$OUT/run/ncu-stall-30b.err;
python3 scripts/ncu_summary.py \$OUT/run/ncu-stall-30b.csv || tail -5 \$OUT/run/ncu-stall-30b.err"
OUT=$OUT MAKE_MORE="python3 scripts/make_moe_bench.py --layers 48 --out $M && python3 scripts/make_moe_bench.py --layers 4 --out $C" \
  BENCH_FILES="$Q8 $Q4 $M" BENCH_ARGS="--depths 4096" PEER_DEPTHS=4096 CHECK_FILES="$C" GREEDY_FILES="$M" EXTRA="$EXTRA" \
  bash scripts/gpu_run.sh quick,bench,peers,fidelity,extra 2>&1 | grep -v "^===" | tail -70
