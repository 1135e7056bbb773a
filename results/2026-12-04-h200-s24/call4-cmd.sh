# s24 call 4 (experiment build: atd_trace.patch applied; gpu_bundle.sh --kernels-xz; carry .gpu): phase stamps of
# the decode attention's block (0,0) inside the 0.6B Q8_0 decode graph at 8 / 40 / 100 / 1000 tokens of context,
# default knobs and with REFLEX_ATTN_MIN_KEYS=64 (one 64-key slice: the second tile after the wait).
T=results/2026-12-04-h200-s24/atd_trace.py; Q=/tmp/real/qwen3-0.6b-q8_0.gguf
OUT=$OUT MAKE_06B=q8_0 EXTRA="python3 $T $Q; echo '--- REFLEX_ATTN_MIN_KEYS=64'; REFLEX_ATTN_MIN_KEYS=64 python3 $T $Q" \
  bash scripts/gpu_run.sh extra 2>&1 | grep -v "^===" | tail -24
