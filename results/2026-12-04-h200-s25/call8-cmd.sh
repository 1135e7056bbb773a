# s25 call 8 (gpu_bundle.sh --kernels-xz --old 3a2aeb7; carry .gpu): the whole GPU suite on main 4f4b41a (the decode
# graph's kernels with the largest shared-memory carveout), then spawn -> first token of this tree and of 3a2aeb7
# (the main this session started from), interleaved, 10 runs each.
OUT=$OUT RUNS=10 bash scripts/gpu_run.sh tests,coldstart_ab 2>&1 | grep -v "^===" | tail -30
