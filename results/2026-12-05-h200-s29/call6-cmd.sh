# s29 call 6 (call 5's tree, warm machine): the rest of the GPU suite (every gpu test file but the kernel tests,
# which call 4's quick tier ran, the engine and fused-step files, which call 4 and 5 ran)
MAKE_06B="" OUT=$OUT TESTS="tests --ignore=tests/test_gpu_kernels.py --ignore=tests/test_gpu_fused_step.py --ignore=tests/test_gpu_engine.py" timeout 225 bash scripts/gpu_run.sh tests 2>&1 | grep -v "^===" | tail -12
