# s25 call 6 (here: `git apply results/2026-12-04-h200-s25/call6-tma-l2.patch && bash scripts/gpu_bundle.sh --kernels-xz --old 4f4b41a` on 4f4b41a; carry .gpu): s24's TMA bulk staging of the mvs tiles and
# the decode attention's L2 prefetch of the next kernels' weights (call5-6-l2-prefetch-tma.patch), retried now
# that consecutive kernels share SMs (4f4b41a, the carveout); REFLEX_L2_AHEAD=0 turns the prefetch off (TMA only).
# reflex check on the 0.6B files first.
OUT=$OUT AB_FILES="/tmp/real/qwen3-0.6b-q8_0.gguf /tmp/real/qwen3-0.6b-q4_k_m.gguf" AB_VARIANTS="tma:REFLEX_L2_AHEAD=0" \
  bash scripts/gpu_run.sh check,decode_ab 2>&1 | grep -v "^===" | tail -12
