# s18 call 1: branch s18 (router-gemm + mla-splits + router-also merged on main): quick tier, the 30B-A3B
# shape and the 0.6B Q8_0 against llama-bench, the router GEMM off for comparison, ncu of a 512-token prefill's GEMMs
R=/tmp/real; M=$R/qwen3moe-30b-a3b-48l-q8_0.gguf; Q8=$R/qwen3-0.6b-q8_0.gguf
export PREFILL=128,512,2048 PEER_P=128,512,2048 BENCH_TIMEOUT=150
P=$(python3 -c "print('The quick brown fox jumps over the lazy dog while the cat sleeps. ' * 40)")
EXTRA="REFLEX_ROUTER_MM=0 python3 -m reflex_runtime.cli bench $M --prefill 512 --decode-tokens 32 --prefill-breakdown 512 --out \$OUT/run/bench-30b-router-mm-off.json | tail -30;
timeout 200 ncu --clock-control none --csv --page details --kernel-name 'regex:gemm|router_mm|moe_group' --launch-count 7 \
 --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats \
 python3 -m reflex_runtime.cli generate '$P' -n 1 --model $M --backend cuda > \$OUT/run/ncu-prefill-30b.csv 2> \$OUT/run/ncu-prefill-30b.err;
python3 scripts/ncu_summary.py \$OUT/run/ncu-prefill-30b.csv --json \$OUT/run/ncu-prefill-30b.json || tail -5 \$OUT/run/ncu-prefill-30b.err"
OUT=$OUT MAKE_MORE="python3 scripts/make_moe_bench.py --layers 48 --out $M" BENCH_FILES="$Q8 $M" BENCH_ARGS="--depths 4096" PEER_DEPTHS=4096 \
  EXTRA="$EXTRA" bash scripts/gpu_run.sh quick,bench,peers,extra 2>&1 | grep -v "^===" | tail -60
