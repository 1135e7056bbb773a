# Prepared in s30 (no GPU lent that session; not run): issue 27's short-context attention path
# (kernels/attn_short.cuh, REFLEX_ATTN_SHORT_KEYS, off by default on main) on the GPU for the first time.
#  - its kernel tests (test_gpu_kernels -k attention_decode: short 0 and 64 on every case), the batch and paged
#    tests, and the engine tests with it on for every test (TEST_ENV): greedy against the reference per family;
#  - tg128 through the engine, interleaved: this tree's defaults (short off), short on, and main before the change
#    (old = 980f923: the tiled path's registers moved 125 -> 128 with 8 bytes spilled when the short path joined it);
#  - spawn -> first token of this tree and old, 10 runs each (coldstart_ab: the fatbin grew);
#  - bench_knobs' role breakdown at a 16-token context (attention us a token, against issue 27's 3 us a layer),
#    default vs short, two rounds, on the 0.6B Q8_0 and the Gemma shape.
# Here first: python3 scripts/build_kernels.py --archs 90
#   bash scripts/gpu_bundle.sh --kernels-xz --lean --old 980f923 --skeleton F   (F: embedded_model_path(), as s29)
# carry [".gpu"]; ~450 s there.
R=/tmp/real
OUT=$OUT TEST_ENV="REFLEX_ATTN_SHORT_KEYS=64" \
  TESTS="tests/test_gpu_kernels.py -k 'attention_decode' tests/test_gpu_batch.py tests/test_gpu_paged.py tests/test_gpu_engine.py" \
  AB_FILES="$R/qwen3-0.6b-q8_0.gguf $R/qwen3-0.6b-q4_k_m.gguf $R/gemma-3-270m-q4_k_m-shaped.gguf" \
  AB_VARIANTS="short:REFLEX_ATTN_SHORT_KEYS=64" \
  KNOBS_FILES="$R/qwen3-0.6b-q8_0.gguf $R/gemma-3-270m-q4_k_m-shaped.gguf" \
  KNOBS="default;attn_short_keys=64;default;attn_short_keys=64" KNOBS_ARGS="--context 16 --tokens 64" \
  bash scripts/gpu_run.sh tests,decode_ab,coldstart_ab,knobs 2>&1 | grep -v "^===" | tail -30
