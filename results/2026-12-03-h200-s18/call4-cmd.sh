# s18 call 4 (same tree as call 2; .vocab carried, .gpu from the warm machine's copy): the DeepSeek-V2-Lite shape against llama-bench
R=/tmp/real; D=$R/deepseek2-v2lite-q8_0.gguf; rm -f $R/qwen35moe-35b-a3b-q4_k_m.gguf $R/qwen35-0.8b-q8_0.gguf
export PREFILL=128,512,2048 PEER_P=128,512,2048 BENCH_TIMEOUT=150
OUT=$OUT MAKE_06B= MAKE_MORE="python3 scripts/make_deepseek_bench.py --type Q8_0 --out $D" BENCH_FILES=$D BENCH_ARGS="--depths 4096" PEER_DEPTHS=4096 bash scripts/gpu_run.sh bench,peers 2>&1 | grep -v "^===" | tail -30
