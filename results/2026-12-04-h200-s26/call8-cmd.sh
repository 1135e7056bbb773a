# s26 call 8 (gpu_bundle.sh --kernels-xz --lean --old d506bab; carry .gpu): spawn -> first token of this tree (fb73277:
# x in shared memory) and of d506bab (the main this session started from), interleaved, 10 runs each.
OUT=$OUT RUNS=10 bash scripts/gpu_run.sh coldstart_ab 2>&1 | grep -v "^===" | tail -12
