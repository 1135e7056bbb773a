# s36 call 3: the tensor-core attention with its loads one group ahead (this tree) against 42e62c9 (its loads
# then the wait; both with the slices rounded down), by depth, in one warm run; the attention's GPU tests with it.
# attn_tc=true: the tensor-core kernels in the graphs of steps over >= 1,024 keys (REFLEX_ATTN_TC_FROM), the
# tile kernels below; attn_tc_from=0: in every graph (as 42e62c9's attn_tc=true).
R=/tmp/real; Q8=$R/qwen3-0.6b-q8_0.gguf; mkdir -p $OUT/t $OUT/k
OUT=$OUT/t MAKE_06B=q8_0 REFLEX_ATTN_TC=1 REFLEX_ATTN_TC_FROM=0 \
  TESTS="tests/test_gpu_kernels.py tests/test_gpu_batch.py tests/test_gpu_paged.py -k 'attention_decode or decode_attention or decode_rows_paged or fused_rope_decode'" \
  bash scripts/gpu_run.sh tests 2>&1 | grep -v "^===" | tail -3
S="default;attn_tc=true;attn_tc=true,attn_tc_from=0"
OUT=$OUT/k MAKE_06B=q8_0 KNOBS_FILES=$Q8 KNOBS_TIMEOUT=300 KNOBS="$S;$S" \
  KNOBS_ARGS="--tokens 128 --depths 1024,4096,8192,16384" bash scripts/gpu_run.sh knobs 2>&1 | grep -v "^===" | tail -6 | cut -c1-150
# the old tree's tensor-core kernel by depth (its package and fatbin, this tree's bench script)
OLDK=$PWD/.gpu/old/_kernels; [ -d $OLDK ] || OLDK=$PWD/reflex_runtime/_kernels
mkdir -p /tmp/oldknobs/scripts && ln -sfn $PWD/.gpu/old/reflex_runtime /tmp/oldknobs/reflex_runtime && cp scripts/bench_knobs.py /tmp/oldknobs/scripts/
PYTHONPATH=/tmp/site REFLEX_KERNELS_DIR=$OLDK timeout 200 python3 /tmp/oldknobs/scripts/bench_knobs.py $Q8 --set default \
  --set attn_tc=true --tokens 128 --depths 1024,4096,8192,16384 --out $OUT/knobs-old.json \
  > $OUT/knobs-old.log 2>&1; echo "old tree $(cat .gpu/old/REV):"; tail -2 $OUT/knobs-old.log | cut -c1-150
