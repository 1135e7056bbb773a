# The next session's second call (same tree and machine as next-call1-cmd.sh; ~300 s): s27's four
# decode-step knobs (results/2026-12-04-cpu-s27/README.md section 2), each against the default in one
# process (bench_knobs, two interleaved rounds, 64 tokens, @d1024 and @d16384), then Gemma's engine tests
# with the post-norm fold.
R=/tmp/real
K="default;mvs_share_x=true;attn_prefetch_tiles=2;attn_prefetch_tiles=2,attn_min_keys=64;mvs_head_stream=1;mvs_head_stream=2;post_fold=true"
OUT=$OUT KNOBS_FILES="$R/qwen3-0.6b-q8_0.gguf $R/qwen3-0.6b-q4_k_m.gguf $R/gemma-3-270m-q4_k_m-shaped.gguf" \
  KNOBS="$K;$K" KNOBS_ARGS="--depths 1024,16384 --tokens 64 --repeats 3" KNOBS_TIMEOUT=300 \
  bash scripts/gpu_run.sh knobs 2>&1 | grep -v "^===" | tail -50
python3 -m pytest -m gpu tests/test_gpu_engine.py -k "post_norms_folded or check_passes_gemma3" -q -p no:cacheprovider \
  > $OUT/gemma-fold-tests.log 2>&1; tail -1 $OUT/gemma-fold-tests.log
