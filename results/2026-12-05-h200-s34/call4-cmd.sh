# s34 call 4 (carry [".gpu"], gpu_bundle.sh --kernels-xz --peers-apart --skeleton F --old 480c6c3):
# cold start of this tree (the energy fix) against 480c6c3, 20 runs each on the 0.6B Q8_0 and the Gemma 3 270M
# shape, every record's joules counted; then compute-sanitizer on s33's one-kernel.patch (call 3 crashed with
# CUDA_ERROR_ILLEGAL_ADDRESS under REFLEX_MVS_ONE_KERNEL=1), built here in a copy of the tree.
R=/tmp/real; G=$R/gemma-3-270m-q4_k_m-shaped.gguf
mkdir -p $OUT/cold $OUT/san
OUT=$OUT/cold RUNS=20 COLD_TIMEOUT=300 EXTRA="timeout 200 python3 scripts/bench_coldstart.py --model $G --runs 20 --cache warm \
  --tree new=\$PWD --tree old=\$PWD/.gpu/old:\$PWD/.gpu/old/_kernels --out \$OUT/run/coldstart-gemma" \
  bash scripts/gpu_run.sh coldstart_ab,extra 2>&1 | grep -v "^===" | grep -E "warm first|AGREE|DISAGREE|per round|done" | tail -20
for f in $OUT/cold/run/coldstart-ab/results.json $OUT/cold/run/coldstart-gemma/results.json; do python3 - $f <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for c in d["cases"]:
    recs = [((r.get("child_record") or {}).get("coldstart") or {}) for r in c["rows"]]
    lost = [x.get("energy_error") for x in recs if x.get("joules_process_start_to_first_token") is None]
    print(f"{c['case'][-45:]:45s} records {len(recs)} without joules {len(lost)} {set(lost) if lost else ''}")
PY
done
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
rm -rf /tmp/pk && cp -a . /tmp/pk && (cd /tmp/pk && git apply results/2026-12-05-h100-s33/one-kernel.patch \
  && timeout 200 python3 scripts/build_kernels.py --archs 90 | tail -1) > $OUT/san/build.log 2>&1
(cd /tmp/pk && REFLEX_MVS_ONE_KERNEL=1 REFLEX_ATTN_OUT_MERGE=0 PYTHONPATH=/tmp/pk:/tmp/site timeout 240 $CS --print-limit 4 \
  python3 -m reflex_runtime.cli generate 'The capital of France is' -n 3 --backend cuda --model $R/qwen3-0.6b-q8_0.gguf) \
  > $OUT/san/sanitizer.log 2>&1; echo "sanitizer rc $?"
grep -m8 -E "Invalid|at 0x|by thread|Address|ERROR SUMMARY|reflex_" $OUT/san/sanitizer.log | cut -c1-200
