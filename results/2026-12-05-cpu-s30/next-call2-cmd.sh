# Prepared in s30 (not run), after call 1 on the same bundle: tg128 through the engine, interleaved, for this
# tree's defaults (both new paths off), each path on, both on, and main before them (old = 980f923: the tiled
# kernel's registers moved 125 -> 128 with 8 bytes spilled when the short path joined it), on the 0.6B Q8_0 /
# Q4_K_M and the Gemma shape; then spawn -> first token against 980f923, 10 runs each (the fatbin grew).
# carry [".gpu"]; ~400 s there.
R=/tmp/real
OUT=$OUT \
  AB_FILES="$R/qwen3-0.6b-q8_0.gguf $R/qwen3-0.6b-q4_k_m.gguf $R/gemma-3-270m-q4_k_m-shaped.gguf" \
  AB_VARIANTS="short:REFLEX_ATTN_SHORT_KEYS=64 stream:REFLEX_ATTN_STREAM=1 both:REFLEX_ATTN_SHORT_KEYS=64,REFLEX_ATTN_STREAM=1" \
  bash scripts/gpu_run.sh decode_ab,coldstart_ab 2>&1 | grep -v "^===" | tail -20
