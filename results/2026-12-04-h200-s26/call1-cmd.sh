# s26 call 1 (gpu_bundle.sh; carry .gpu and reflex_runtime/_kernels; tree d506bab + this folder):
# the extended in-order probe (s25's order.cu / order.py with its order2.patch; they ran as copies in this folder, since
# removed: here `git apply results/2026-12-04-h200-s25/order2.patch && nvcc -cubin -arch=sm_90a $P/order.cu -o $P/order.cubin`,
# carry the cubin, and `git checkout results/2026-12-04-h200-s25` after the call), the decode loop's time
# between steps (step_gap2.py), and the decode attention's blocks per SM at 16,384 tokens of context (bench_knobs,
# two interleaved rounds).
R=/tmp/real; D=results/2026-12-04-h200-s26; P=results/2026-12-04-h200-s25
OUT=$OUT MAKE_06B=q8_0 KNOBS_FILES=$R/qwen3-0.6b-q8_0.gguf \
  KNOBS="default;attn_blocks_per_sm=5.0;attn_blocks_per_sm=8.0;default;attn_blocks_per_sm=5.0;attn_blocks_per_sm=8.0" \
  KNOBS_ARGS="--depths 16384 --tokens 64 --repeats 3" \
  EXTRA="(cd $P && timeout 120 python3 order.py order.cubin) > \$OUT/order2.log 2>&1; tail -32 \$OUT/order2.log; \
timeout 200 python3 $D/step_gap2.py $R/qwen3-0.6b-q8_0.gguf 128 8 5" \
  bash scripts/gpu_run.sh knobs,extra 2>&1 | grep -v "^===" | tail -60
