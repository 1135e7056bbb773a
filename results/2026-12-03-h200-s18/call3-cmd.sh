# s18 call 3 (same tree as call 2): the Qwen3.5-35B-A3B Q4_K_M and 0.8B Q8_0 shapes against llama-bench
R=/tmp/real; H=$R/qwen35moe-35b-a3b-q4_k_m.gguf; S=$R/qwen35-0.8b-q8_0.gguf; rm -f $R/qwen3moe-30b-a3b-48l-q8_0.gguf
export PREFILL=128,512,2048 PEER_P=128,512,2048 BENCH_TIMEOUT=150
OUT=$OUT MAKE_06B= MAKE_MORE="python3 scripts/make_qwen35_bench.py --model 35b-a3b --type q4_k_m --out $H && python3 scripts/make_qwen35_bench.py --model 0.8b --type q8_0 --out $S" BENCH_FILES="$H $S" BENCH_ARGS="--depths 4096" PEER_DEPTHS=4096 bash scripts/gpu_run.sh bench,peers 2>&1 | grep -v "^===" | tail -30
