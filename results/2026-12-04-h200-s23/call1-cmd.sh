# s23 call 1 (gpu_bundle.sh --kernels-xz --old 079694d --vocab deepseek-llm; carry .gpu .vocab): the grouped expert
# GEMMs read f16 activations (the input rows rounded once by reflex_gemm_to_half, act written in f16 by gate/up).
# The GPU tests of the prompt GEMMs and the MoE families, then this tree against 079694d (.gpu/old) on the 30B-A3B
# and DeepSeek-V2-Lite shapes' 512/2,048-token prefill, interleaved, two rounds, and this tree's 512-token
# prefill by role on both. No llama.cpp here: an A/B of our own kernels.
R=/tmp/real; M=$R/qwen3moe-30b-a3b-48l-q8_0.gguf; D=$R/deepseek2-v2lite-q8_0.gguf
AB='for r in 1 2; do for t in new old; do for f in '"$M $D"'; do n=$(basename $f .gguf);
  if [ $t = old ]; then env PYTHONPATH=$PWD/.gpu/old:/tmp/site REFLEX_KERNELS_DIR=$PWD/.gpu/old/_kernels timeout 120 python3 -m reflex_runtime.cli bench $f --prefill 512,2048 --decode-tokens 16 --out $OUT/run/ab-$t-$n-$r.json > /tmp/ab.log 2>&1;
  else timeout 120 python3 -m reflex_runtime.cli bench $f --prefill 512,2048 --decode-tokens 16 --out $OUT/run/ab-$t-$n-$r.json > /tmp/ab.log 2>&1; fi;
  echo "$r $t $n $(grep -h "prefill " /tmp/ab.log | tr -s " " | tr "\n" " ")"; done; done; done;
  for f in '"$M $D"'; do n=$(basename $f .gguf); timeout 150 python3 -m reflex_runtime.cli bench $f --prefill 512 --decode-tokens 16 --prefill-breakdown 512 --out $OUT/run/roles-$n.json > $OUT/run/roles-$n.log 2>&1; echo "roles $n: $(grep -i "experts\|total" $OUT/run/roles-$n.log | tr -s " " | tr "\n" ";")"; done'
OUT=$OUT MAKE_06B= MAKE_MORE="python3 scripts/make_moe_bench.py --layers 48 --out $M && python3 scripts/make_deepseek_bench.py --type Q8_0 --out $D" \
  TESTS="tests/test_gpu_kernels.py tests/test_gpu_moe.py tests/test_gpu_deepseek2.py tests/test_gpu_qwen35.py -k 'gemm or tensor_core or grouped or moe or prefill or check or long'" TEST_TIMEOUT=240 \
  EXTRA="$AB" bash scripts/gpu_run.sh tests,extra 2>&1 | grep -v "^===" | tail -40
