# s20 call 5 (call 4's warm machine and bundle, nothing carried): the tests call 4 meant to run (its -k expression did
# not survive the word splitting of TESTS): the router GEMM with and without K slices, and the MoE / DeepSeek engines
# against the numpy reference through it (check of every type, greedy, the long grouped prompt)
T=tests/test_gpu_moe.py; D=tests/test_gpu_deepseek2.py
OUT=$OUT MAKE_06B= TEST_TIMEOUT=300 TESTS="$T::test_router_logits_of_a_prompt $T::test_check_passes_qwen3moe $T::test_qwen3moe_long_prompt_grouped_prefill_and_greedy_32 $D::test_check_passes_deepseek $D::test_greedy_generate_equals_reference_for_32_tokens $D::test_long_prompt_in_chunks_on_tensor_cores tests/test_gpu_qwen35.py::test_check_passes" \
  bash scripts/gpu_run.sh tests 2>&1 | grep -v "^===" | tail -30
