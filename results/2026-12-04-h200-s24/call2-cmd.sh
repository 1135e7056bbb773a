# s24 call 2 (gpu_bundle.sh --kernels-xz; carry .gpu; tree = main 9060e53): the whole GPU suite (issue 31's last
# item), then ncu on 8 decode-attention launches of the 0.6B Q8_0 (a ~6-token context) with per-instruction
# stall sampling (SourceCounters), exported as SASS csv: where a short-context attention launch spends its time.
R=/tmp/real
OUT=$OUT/t TEST_TIMEOUT=450 bash scripts/gpu_run.sh tests 2>&1 | grep -v "^===" | tail -30
mkdir -p $OUT/p
timeout 100 ncu --clock-control none --graph-profiling node --kernel-name regex:attn_decode --launch-skip 56 --launch-count 8 \
  --section SourceCounters --section WarpStateStats --section SpeedOfLight --import-source no -o /tmp/atd \
  python3 -m reflex_runtime.cli generate "The capital of France is" -n 6 --model $R/qwen3-0.6b-q8_0.gguf --backend cuda \
  > $OUT/p/ncu.log 2>&1; tail -3 $OUT/p/ncu.log
ncu -i /tmp/atd.ncu-rep --page source --csv --print-source sass > $OUT/p/atd-sass.csv 2> $OUT/p/export.err
ncu -i /tmp/atd.ncu-rep --page details --csv > $OUT/p/atd-details.csv 2>> $OUT/p/export.err
ls -la $OUT/p; head -c 600 $OUT/p/atd-sass.csv; xz -9 $OUT/p/*.csv
