# s25 call 3 (here: `git apply results/2026-12-04-h200-s25/mvs_trace2.patch && bash scripts/gpu_bundle.sh --kernels-xz`
# on 3a2aeb7 or 4f4b41a, whose kernels are the same; carry .gpu): per-block phases and SMs of every matrix launch.
OUT=$OUT MAKE_06B=q8_0 EXTRA="python3 results/2026-12-04-h200-s25/mvs_trace2.py /tmp/real/qwen3-0.6b-q8_0.gguf 8" \
  bash scripts/gpu_run.sh extra 2>&1 | tail -12
