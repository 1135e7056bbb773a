# s25 call 4 (as call 3, on the tree with the carveout, 4f4b41a's launch.py / driver.py): decode tok/s with the
# largest carveout and with the driver's, interleaved in one process, and the trace under both.
export OUT=$OUT MAKE_06B=q8_0 KNOBS_FILES=/tmp/real/qwen3-0.6b-q8_0.gguf KNOBS="default;carveout=-1;default;carveout=-1"
EXTRA="python3 results/2026-12-04-h200-s25/mvs_trace2.py /tmp/real/qwen3-0.6b-q8_0.gguf 8; REFLEX_SMEM_CARVEOUT=-1 python3 results/2026-12-04-h200-s25/mvs_trace2.py /tmp/real/qwen3-0.6b-q8_0.gguf 9" \
  bash scripts/gpu_run.sh knobs,extra 2>&1 | tail -16
