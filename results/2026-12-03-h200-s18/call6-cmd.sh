# s18 call 6: the one failure of call 5 (qwen35moe long prompt) with the MoE references reporting routing margins
OUT=$OUT TESTS="tests/test_gpu_qwen35.py" PYTEST_ADDOPTS="-k long_prompt" TEST_TIMEOUT=200 bash scripts/gpu_run.sh tests 2>&1 | grep -v "^===" | tail -6
PYTHONPATH=$PWD:/tmp/site REFLEX_TEST_CACHE=/tmp/reflex-test-cache timeout 120 python3 results/2026-12-03-h200-s18/call6-check.py 2>&1 | tail -2
