# s31 call 3: this tree (the short path and the stream kernel taken out: reflex_attn_decode is 980f923's again, the
# fatbin byte-identical to the old tree's) through the decode attention's GPU tests with their new cases (values
# narrower / wider than keys, long slices, 32-wide heads, softcap); then tg128 through the engine against 980f923
# (a control: the same kernels) and with one slice a KV head up to 64 / 128 keys (REFLEX_ATTN_MIN_KEYS; call 2's
# attention alone cost 6.5 us a layer at 16 keys, one slice, and 9.3 at 64, two slices and their merge).
# Here first: python3 scripts/build_kernels.py --archs 90; bash scripts/gpu_bundle.sh --kernels-xz --lean --old 980f923 --skeleton F
# and reflex bench's attention by context and decode at depth for min_keys 32 / 64 / 128 (EXTRA).
# carry [".gpu"]; ~250 s there.
R=/tmp/real
OUT=$OUT MAKE_06B=q8_0 \
  TESTS="tests/test_gpu_kernels.py::test_attention_decode tests/test_gpu_kernels.py::test_attention_decode_with_fused_rope_and_store tests/test_gpu_kernels.py::test_attention_decode_refuses_what_it_cannot_serve tests/test_gpu_batch.py tests/test_gpu_paged.py" \
  AB_FILES="$R/qwen3-0.6b-q8_0.gguf $R/gemma-3-270m-q4_k_m-shaped.gguf" \
  AB_VARIANTS="mk64:REFLEX_ATTN_MIN_KEYS=64 mk128:REFLEX_ATTN_MIN_KEYS=128" \
  EXTRA='for mk in 32 64 128; do REFLEX_ATTN_MIN_KEYS=$mk timeout 100 python3 -m reflex_runtime.cli bench /tmp/real/qwen3-0.6b-q8_0.gguf --prefill 16 --decode-tokens 64 --depths 1024,4096,16384 --out $OUT/run/bench-mk$mk.json > /dev/null 2>&1; python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], [(r[\"context\"], r.get(\"us_per_launch\")) for r in d[\"attention_by_context\"]], [(r[\"depth\"], r[\"tok_s\"]) for r in d[\"decode_at_depth\"]])" $OUT/run/bench-mk$mk.json min_keys=$mk; done' \
  bash scripts/gpu_run.sh tests,decode_ab,extra 2>&1 | grep -v "^===" | tail -12
