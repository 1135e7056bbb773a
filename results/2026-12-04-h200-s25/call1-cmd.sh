# s25 call 1 (here: `git apply results/2026-12-04-h200-s24/mvs_trace.patch && bash scripts/gpu_bundle.sh --kernels-xz`;
# carry .gpu): s24's prepared trace of the matrix kernels inside the 0.6B Q8_0 decode graph, 8 and 200 tokens of context.
OUT=$OUT MAKE_06B=q8_0 EXTRA="python3 results/2026-12-04-h200-s24/mvs_trace.py /tmp/real/qwen3-0.6b-q8_0.gguf 8; python3 results/2026-12-04-h200-s24/mvs_trace.py /tmp/real/qwen3-0.6b-q8_0.gguf 200" \
  bash scripts/gpu_run.sh extra 2>&1 | tail -14
