# s20 call 2 (gpu_bundle.sh --peers --kernels-xz --lean --vocab deepseek-llm; carry .gpu .vocab): the tests of the
# real-width DeepSeek fixtures (v2lite_wide's reflex check of every type, v3_wide's engine tests), the DeepSeek-V2-Lite
# shape vs llama-bench with the prompt latent attention on tensor cores, and mla.cu's kernel (REFLEX_MLA_FLASH=0) in the
# same call; reflex check on a 4-layer same-shaped file, 32 greedy tokens vs llama-server on the full-size file; the
# Qwen3.5-0.8B greedy departure (s19) asked again with llama.cpp's flash attention off (-fa off) and the reference
R=/tmp/real; D=$R/deepseek2-v2lite-q8_0.gguf; D4=$R/deepseek2-v2lite-4l-q8_0.gguf; S=$R/qwen35-0.8b-q8_0.gguf
export PREFILL=128,512,2048 PEER_P=128,512,2048 BENCH_TIMEOUT=150 GREEDY_TIMEOUT=150 TEST_TIMEOUT=200
MK="python3 scripts/make_qwen35_bench.py"
EXTRA="REFLEX_MLA_FLASH=0 python3 -m reflex_runtime.cli bench $D --prefill 512,2048 --decode-tokens 16 --out \$OUT/run/bench-deepseek-mla-cuda-cores.json | grep -i 'prefill\|mla att';
timeout 150 python3 scripts/greedy_vs_llama.py $S --llama-server /tmp/peers/llama.cpp/llama-server -n 32 --reference --llama-args='-fa off' --out \$OUT/run/greedy-08b-fa-off.json 2> \$OUT/run/greedy-08b-fa-off.err | tail -8"
OUT=$OUT MAKE_06B= MAKE_MORE="python3 scripts/make_deepseek_bench.py --type Q8_0 --out $D && python3 scripts/make_deepseek_bench.py --type Q8_0 --layers 4 --out $D4 && $MK --model 0.8b --type q8_0 --out $S" \
  TESTS="tests/test_gpu_deepseek2.py -k wide" BENCH_FILES=$D BENCH_ARGS="--depths 4096" PEER_DEPTHS=4096 CHECK_FILES=$D4 \
  GREEDY_FILES=$D EXTRA="$EXTRA" bash scripts/gpu_run.sh tests,bench,peers,fidelity,extra 2>&1 | grep -v "^===" | tail -50
