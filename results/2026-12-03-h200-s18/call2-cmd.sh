# s18 call 2: s18 + the parallel moe_group, the router GEMM's fused RMS, 32-pair expert tiles: quick tier,
# the 30B-A3B shape and the 0.6B Q8_0 against llama-bench, 64-pair tiles forced for comparison
R=/tmp/real; M=$R/qwen3moe-30b-a3b-48l-q8_0.gguf; Q8=$R/qwen3-0.6b-q8_0.gguf
export PREFILL=128,512,2048 PEER_P=128,512,2048 BENCH_TIMEOUT=150
EXTRA="REFLEX_MOE_TILE=64 python3 -m reflex_runtime.cli bench $M --prefill 128,512,2048 --decode-tokens 32 --prefill-breakdown 512 --out \$OUT/run/bench-30b-tile64.json | grep -E 'prefill|moe|group';
REFLEX_MOE_TILE=32 python3 -m reflex_runtime.cli bench $M --prefill 2048 --decode-tokens 32 --prefill-breakdown 2048 --out \$OUT/run/bench-30b-tile32-2048.json | grep -E 'prefill|moe|group'"
OUT=$OUT MAKE_MORE="python3 scripts/make_moe_bench.py --layers 48 --out $M" BENCH_FILES="$Q8 $M" BENCH_ARGS="--depths 4096" PEER_DEPTHS=4096 \
  EXTRA="$EXTRA" bash scripts/gpu_run.sh quick,bench,peers,extra 2>&1 | grep -v "^===" | tail -70
