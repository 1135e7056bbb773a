# s23 call 3 (gpu_bundle.sh --kernels-xz --vocab deepseek-llm, plus .gpu/variants.tar.xz: three sm_90 fatbins of
# kernels/gemm.cu variants; carry .gpu .vocab): the grouped expert GEMMs with two weight stages (call 2's third stage
# dropped) and v0: 3 x 64-pair blocks an SM, 3 activation slots; v1: 4 blocks an SM; v2: 5 activation slots (4
# steps ahead). 512-token prefill by role of the 30B-A3B and DeepSeek-V2-Lite shapes, variants interleaved, two
# rounds. No llama.cpp here: an A/B of our own kernels.
R=/tmp/real; M=$R/qwen3moe-30b-a3b-48l-q8_0.gguf; D=$R/deepseek2-v2lite-q8_0.gguf
AB='mkdir -p /tmp/var && tar xJf .gpu/variants.tar.xz -C /tmp/var; for r in 1 2; do for v in v0 v1 v2; do for f in '"$M $D"'; do n=$(basename $f .gguf);
  na=3; [ $v = v2 ] && na=5;
  REFLEX_AB_NA_F16=$na REFLEX_KERNELS_DIR=/tmp/var/$v timeout 120 python3 -m reflex_runtime.cli bench $f --prefill 512 --decode-tokens 16 --prefill-breakdown 512 --out $OUT/run/ab-$v-$n-$r.json > $OUT/run/ab-$v-$n-$r.log 2>&1;
  echo "$r $v $n $(grep -h "prefill  \|experts" $OUT/run/ab-$v-$n-$r.log | tr -s " " | tr "\n" ";")"; done; done; done'
OUT=$OUT MAKE_06B= MAKE_MORE="python3 scripts/make_moe_bench.py --layers 48 --out $M && python3 scripts/make_deepseek_bench.py --type Q8_0 --out $D" \
  EXTRA="$AB" bash scripts/gpu_run.sh extra 2>&1 | grep -v "^===" | tail -20
