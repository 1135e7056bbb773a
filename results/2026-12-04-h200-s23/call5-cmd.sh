# s23 call 5 (gpu_bundle.sh --kernels-xz; carry .gpu): the GPU test files of the MoE families on call 4's tree (the
# whole suite did not fit the device time left): test_gpu_moe, test_gpu_deepseek2, test_gpu_qwen35,
# test_gpu_experts_on_demand. Logs: $OUT/run.tgz
OUT=$OUT MAKE_06B= TESTS="tests/test_gpu_moe.py tests/test_gpu_deepseek2.py tests/test_gpu_qwen35.py tests/test_gpu_experts_on_demand.py" \
  TEST_TIMEOUT=170 bash scripts/gpu_run.sh tests 2>&1 | grep -v "^===" | grep "passed\|failed\|rror\|FAIL" | tail -8
