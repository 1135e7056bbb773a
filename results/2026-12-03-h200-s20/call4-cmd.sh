# s20 call 4 (gpu_bundle.sh --peers --kernels-xz --lean --vocab deepseek-llm, the llama-server addon left out to fit
# 64 MiB with .vocab; carry .gpu .vocab): the router's K slices (kernels/moe.cu reflex_moe_router_mm) through the MoE and
# DeepSeek GPU tests, then the 30B-A3B (48 layers, Q8_0) and DeepSeek-V2-Lite shapes vs llama-bench at 512 and 2,048
# tokens, and the same without the slices (REFLEX_ROUTER_SPLITS=1) in the same call
R=/tmp/real; M=$R/qwen3moe-30b-a3b-48l-q8_0.gguf; D=$R/deepseek2-v2lite-q8_0.gguf
export PREFILL=512,2048 PEER_P=512,2048 BENCH_TIMEOUT=150 TEST_TIMEOUT=230
EXTRA="for f in $M $D; do REFLEX_ROUTER_SPLITS=1 python3 -m reflex_runtime.cli bench \$f --prefill 512,2048 --decode-tokens 16 --out \$OUT/run/bench-\$(basename \$f .gguf)-no-slices.json | grep -i 'prefill \|router'; done"
OUT=$OUT MAKE_06B= MAKE_MORE="python3 scripts/make_moe_bench.py --layers 48 --out $M && python3 scripts/make_deepseek_bench.py --type Q8_0 --out $D" \
  TESTS="tests/test_gpu_moe.py tests/test_gpu_deepseek2.py -k 'router or check_passes or greedy'" BENCH_FILES="$M $D" \
  EXTRA="$EXTRA" bash scripts/gpu_run.sh tests,bench,peers,extra 2>&1 | grep -v "^===" | tail -50
