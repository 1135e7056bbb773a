# Prepared in s31 (not run: the device budget was spent on refused starts): REFLEX_ATTN_ONE_SLICE_KEYS on the GPU.
# - the decode attention's GPU tests (kernels, batch rows, paged, the one-kernel step whose program plans the same
#   slices), one_slice among their parameters;
# - tg128 through the engine against 980f923, interleaved: this tree's defaults (must equal it: the kernel gained one
#   int parameter, 125 registers and no spill as before), one slice up to 64 / 128 / 256 keys, and min_keys 64
#   (one slice to 64 keys, but halves the slices at depth too);
# - reflex bench with one_slice 0 / 128: the attention alone at 16 / 64 / 256 keys, decode @d1024 / 4096 / 16384
#   (unchanged where every row has more than 128 keys).
# Here first: python3 scripts/build_kernels.py --archs 90
#   bash scripts/gpu_bundle.sh --kernels-xz --lean --old 980f923 --skeleton F   (F: embedded_model_path())
# carry [".gpu"]; ~300 s there (~150 s of it making the 0.6B files).
R=/tmp/real
OUT=$OUT \
  TESTS="tests/test_gpu_kernels.py::test_attention_decode tests/test_gpu_kernels.py::test_attention_decode_with_fused_rope_and_store tests/test_gpu_batch.py tests/test_gpu_paged.py tests/test_gpu_fused_step.py" \
  AB_FILES="$R/qwen3-0.6b-q8_0.gguf $R/qwen3-0.6b-q4_k_m.gguf $R/gemma-3-270m-q4_k_m-shaped.gguf" \
  AB_VARIANTS="os64:REFLEX_ATTN_ONE_SLICE_KEYS=64 os128:REFLEX_ATTN_ONE_SLICE_KEYS=128 os256:REFLEX_ATTN_ONE_SLICE_KEYS=256 mk64:REFLEX_ATTN_MIN_KEYS=64" \
  EXTRA='for os in 0 128 0 128; do REFLEX_ATTN_ONE_SLICE_KEYS=$os timeout 100 python3 -m reflex_runtime.cli bench /tmp/real/qwen3-0.6b-q8_0.gguf --prefill 16 --decode-tokens 64 --depths 1024,4096,16384 --out $OUT/run/bench-os$os.json > /dev/null 2>&1; python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], [(r[\"context\"], r.get(\"us_per_launch\")) for r in d[\"attention_by_context\"]], [(r[\"depth\"], r[\"tok_s\"]) for r in d[\"decode_at_depth\"]])" $OUT/run/bench-os$os.json one_slice=$os; done' \
  bash scripts/gpu_run.sh tests,decode_ab,extra 2>&1 | grep -v "^===" | tail -16
