# s20 call 2 (gpu_bundle.sh --peers --kernels-xz --lean --vocab deepseek-llm; carry .gpu alone: with .vocab the call
# is over 64 MiB, so .vocab travels in call 3 on the same warm machine): the tests of the real-width DeepSeek fixtures
# (v2lite_wide's reflex check of every type, v3_wide's engine tests); the Qwen3.5-0.8B greedy departure (s19) asked
# again with llama.cpp's flash attention off (-fa off) and the numpy reference
R=/tmp/real; S=$R/qwen35-0.8b-q8_0.gguf
export TEST_TIMEOUT=200 GREEDY_TIMEOUT=150 GREEDY_REFERENCE=1 GREEDY_LLAMA_ARGS="-fa off"
OUT=$OUT MAKE_06B= MAKE_MORE="python3 scripts/make_qwen35_bench.py --model 0.8b --type q8_0 --out $S" \
  TESTS="tests/test_gpu_deepseek2.py -k wide" GREEDY_FILES=$S bash scripts/gpu_run.sh tests,fidelity 2>&1 | grep -v "^===" | tail -40
