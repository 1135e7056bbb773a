# s29 call 5 (call 4's tree + the fused-step test comparing with the graph's post-norms as norm launches; warm
# machine): Gemma's fused-step tests and the logits test
MAKE_06B="" OUT=$OUT TESTS="tests/test_gpu_fused_step.py -k 'gemma3 or logits_equal'" bash scripts/gpu_run.sh tests 2>&1 | grep -v "^===" | tail -8
