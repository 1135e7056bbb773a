# s22 call 3 (gpu_bundle.sh --kernels-xz --old a0d7a68; carry .gpu): kernels/gemm.cu's mainloop issues the k 0..15
# mma of every 8-row tile before the k 16..31 ones (no two mmas into one accumulator back to back); the prompt GEMM
# tests, then this tree against a0d7a68 (.gpu/old) on the 30B-A3B and DeepSeek-V2-Lite shapes' 512/2,048-token
# prefill, interleaved, two rounds. No llama.cpp here: an A/B of our own kernels.
R=/tmp/real; M=$R/qwen3moe-30b-a3b-48l-q8_0.gguf; D=$R/deepseek2-v2lite-q8_0.gguf
AB='for r in 1 2; do for t in new old; do for f in '"$M $D"'; do n=$(basename $f .gguf);
  if [ $t = old ]; then env PYTHONPATH=$PWD/.gpu/old:/tmp/site REFLEX_KERNELS_DIR=$PWD/.gpu/old/_kernels timeout 120 python3 -m reflex_runtime.cli bench $f --prefill 512,2048 --decode-tokens 16 --out $OUT/run/ab-$t-$n-$r.json > /tmp/ab.log 2>&1;
  else timeout 120 python3 -m reflex_runtime.cli bench $f --prefill 512,2048 --decode-tokens 16 --out $OUT/run/ab-$t-$n-$r.json > /tmp/ab.log 2>&1; fi;
  echo "$r $t $n $(grep -h "prefill " /tmp/ab.log | tr -s " " | tr "\n" " ")"; done; done; done'
OUT=$OUT MAKE_06B= MAKE_MORE="python3 scripts/make_moe_bench.py --layers 48 --out $M && python3 scripts/make_deepseek_bench.py --type Q8_0 --out $D" \
  TESTS="tests/test_gpu_kernels.py tests/test_gpu_moe.py -k 'gemm or tensor_core or grouped'" TEST_TIMEOUT=200 \
  EXTRA="$AB" bash scripts/gpu_run.sh tests,extra 2>&1 | grep -v "^===" | tail -30
