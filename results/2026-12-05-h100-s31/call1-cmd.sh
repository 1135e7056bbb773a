# Prepared in s30 (no GPU lent that session; not run): issue 27's two new decode-attention paths, both
# off by default on main, on the GPU for the first time:
#   REFLEX_ATTN_SHORT_KEYS=64  contexts of up to 64 keys: a warp per query head (kernels/attn_short.cuh)
#   REFLEX_ATTN_STREAM=1       every warp streams its own keys through a ring (kernels/attn_stream.cu)
#  - the attention kernel tests (both knobs are parameters there), the batch and paged tests, and the engine
#    tests with both on for every test (TEST_ENV): greedy against the reference per family;
#  - bench_knobs on the 0.6B Q8_0 and the Gemma shape (Gemma's 256-wide heads keep the tiled kernel under
#    attn_stream): tg64 after a 5-token prompt, the role breakdown at a 16-token context, and decode at
#    1,024 / 4,096 / 16,384 tokens, for default, short, stream, both; two rounds.
# Here first: python3 scripts/build_kernels.py --archs 90
#   bash scripts/gpu_bundle.sh --kernels-xz --lean --old 980f923 --skeleton F   (F: embedded_model_path(), as s29)
# carry [".gpu"]; ~450 s there. Call 2 (next-call2-cmd.sh) runs on the same bundle.
R=/tmp/real
OUT=$OUT TEST_ENV="REFLEX_ATTN_SHORT_KEYS=64 REFLEX_ATTN_STREAM=1" \
  TESTS="tests/test_gpu_kernels.py -k 'attention_decode' tests/test_gpu_batch.py tests/test_gpu_paged.py tests/test_gpu_engine.py" \
  KNOBS_FILES="$R/qwen3-0.6b-q8_0.gguf $R/gemma-3-270m-q4_k_m-shaped.gguf" KNOBS_TIMEOUT=400 \
  KNOBS="default;attn_short_keys=64;attn_stream=true;attn_short_keys=64,attn_stream=true;default;attn_short_keys=64;attn_stream=true;attn_short_keys=64,attn_stream=true" \
  KNOBS_ARGS="--context 16 --tokens 64 --depths 1024,4096,16384" \
  bash scripts/gpu_run.sh tests,knobs 2>&1 | grep -v "^===" | tail -40
