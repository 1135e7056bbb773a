# The next session's second call (same tree and warm machine as next-call1-cmd.sh; ~250 s): Gemma's engine
# tests with s27's post-norm fold, then tg128 through the engine against main (decode_ab, interleaved rounds):
# the patched tree with no knob set (must equal main), every s27 knob on, share_x alone, and the one-kernel step
# with its five options; then spawn -> first token against main (coldstart_ab, 10 runs each: the patch's fatbin
# is compressed by fatbinary, s27 README's last section). (s27's own script ran the Gemma tests outside
# gpu_run.sh, without its PYTHONPATH: they go through its tests step here.)
R=/tmp/real
OUT=$OUT TESTS="tests/test_gpu_engine.py -k 'post_norms_folded or check_passes_gemma3'" \
  AB_FILES="$R/qwen3-0.6b-q8_0.gguf $R/gemma-3-270m-q4_k_m-shaped.gguf" \
  AB_VARIANTS="all:REFLEX_ATTN_PREFETCH_TILES=2,REFLEX_ATTN_MIN_KEYS=64,REFLEX_MVS_HEAD_STREAM=2,REFLEX_POST_FOLD=1,REFLEX_MVS_SHARE_X=1 share:REFLEX_MVS_SHARE_X=1 fused:REFLEX_FUSED_STEP=1,REFLEX_FUSED_X_EARLY=1,REFLEX_FUSED_LOOKAHEAD=1,REFLEX_FUSED_ATTN_EARLY=1,REFLEX_FUSED_ATTN_GROUPS=1,REFLEX_FUSED_FOLD_NORMS=1" \
  bash scripts/gpu_run.sh tests,decode_ab,coldstart_ab 2>&1 | grep -v "^===" | tail -14
