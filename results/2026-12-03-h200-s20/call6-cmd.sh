# s20 call 6 (carry .gpu): call 5 ran out of its 300 s with 98 passed, none failed, a third not run (fixtures of every
# type): the router GEMM with and without K slices, and one or two files per MoE family through it
T=tests/test_gpu_moe.py; D=tests/test_gpu_deepseek2.py
OUT=$OUT MAKE_06B= TEST_TIMEOUT=200 TESTS="$T::test_router_logits_of_a_prompt $T::test_check_passes_qwen3moe[q8_0] $T::test_check_passes_qwen3moe[q4_k_m] $T::test_qwen3moe_long_prompt_grouped_prefill_and_greedy_32 $D::test_check_passes_deepseek[v2lite-q8_0] $D::test_check_passes_deepseek[v3-q4_k_m] $D::test_check_passes_deepseek[v2lite_wide-q4_k] $D::test_greedy_generate_equals_reference_for_32_tokens[v3_wide] tests/test_gpu_qwen35.py::test_check_passes[q8_0-qwen35moe]" \
  bash scripts/gpu_run.sh tests 2>&1 | grep -v "^===" | tail -30
