# s29 call 4 (tree: main 2c9f919 + the streamed LM head and the folded post-norm as _post kernels, both on by
# default, and the one-kernel step's five options on by default; bundle: gpu_bundle.sh --kernels-xz --old main
# --skeleton EMBEDDED_GEMMA, carry .gpu): the quick GPU tier (kernel tests, one engine test per family), the
# one-kernel step's tests and the engine tests, then tg128 through the engine against main (decode_ab: this
# tree's defaults, each of the two off, both off = main's kernels), then spawn -> first token against main
# (coldstart_ab, 10 runs each: the fatbin grew by the _post kernels).
R=/tmp/real
OUT=$OUT TESTS="tests/test_gpu_fused_step.py tests/test_gpu_engine.py" \
  AB_FILES="$R/qwen3-0.6b-q8_0.gguf $R/qwen3-0.6b-q4_k_m.gguf $R/gemma-3-270m-q4_k_m-shaped.gguf" \
  AB_VARIANTS="nohs:REFLEX_MVS_HEAD_STREAM=0 nofold:REFLEX_POST_FOLD=0 off:REFLEX_MVS_HEAD_STREAM=0,REFLEX_POST_FOLD=0" \
  bash scripts/gpu_run.sh quick,tests,decode_ab,coldstart_ab 2>&1 | grep -v "^===" | tail -25
