# s19 call 3: call 2's tree + one-warp-row 64-pair expert tiles (GemmMoeW, empty 16-pair parts skipped) as the default,
# weight copies two threads a row with row pointers found once, predicated copies; quick tier, the 0.6B Q8_0, 30B-A3B and
# 35B-A3B shapes vs llama-bench, 32-pair tiles forced on the 30B for the A/B, greedy vs llama-server on the 35B file
R=/tmp/real; M=$R/qwen3moe-30b-a3b-48l-q8_0.gguf; H=$R/qwen35moe-35b-a3b-q4_k_m.gguf; Q8=$R/qwen3-0.6b-q8_0.gguf
export PREFILL=128,512,2048 PEER_P=128,512,2048 BENCH_TIMEOUT=150 GREEDY_TIMEOUT=240
EXTRA="REFLEX_MOE_TILE=32 python3 -m reflex_runtime.cli bench $M --prefill 512,2048 --decode-tokens 16 --out \$OUT/run/bench-30b-tile32.json | grep -A14 'prefill by role'"
OUT=$OUT MAKE_06B=q8_0 MAKE_MORE="python3 scripts/make_moe_bench.py --layers 48 --out $M && python3 scripts/make_qwen35_bench.py --model 35b-a3b --type q4_k_m --out $H" \
  BENCH_FILES="$Q8 $M $H" BENCH_ARGS="--depths 4096" PEER_DEPTHS=4096 GREEDY_FILES="$H" EXTRA="$EXTRA" \
  bash scripts/gpu_run.sh quick,bench,peers,fidelity,extra 2>&1 | grep -v "^===" | tail -60
