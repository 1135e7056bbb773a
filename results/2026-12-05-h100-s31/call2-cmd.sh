# s31 call 2 (after call 1: the short path lost, the stream kernel a wash): tg128 through the engine, this tree's
# defaults (both paths off) against 980f923 (before the short path joined reflex_attn_decode: 125 -> 128 registers,
# 8 bytes spilled) and with the stream kernel on, interleaved; spawn -> first token against 980f923; then the
# attention alone by context (reflex bench's attention_by_context) with the short path off and on, to tell the
# kernel's own cost from its place in the step.  carry [".gpu"] (gpu_bundle.sh --kernels-xz --lean --old 980f923 --skeleton F)
R=/tmp/real
OUT=$OUT \
  AB_FILES="$R/qwen3-0.6b-q8_0.gguf $R/qwen3-0.6b-q4_k_m.gguf $R/gemma-3-270m-q4_k_m-shaped.gguf" \
  AB_VARIANTS="stream:REFLEX_ATTN_STREAM=1" \
  EXTRA='for s in 0 64 0 64; do REFLEX_ATTN_SHORT_KEYS=$s timeout 120 python3 -m reflex_runtime.cli bench /tmp/real/qwen3-0.6b-q8_0.gguf --prefill 16 --decode-tokens 32 --out $OUT/run/attn-short$s.json > /dev/null 2>&1; python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], [(r[\"context\"], r.get(\"role\"), r.get(\"us_per_launch\")) for r in d[\"attention_by_context\"]])" $OUT/run/attn-short$s.json short=$s; done' \
  bash scripts/gpu_run.sh decode_ab,coldstart_ab,extra 2>&1 | grep -v "^===" | tail -24
