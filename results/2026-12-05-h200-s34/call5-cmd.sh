# s34 call 5 (carry [".gpu"]): where the decode attention's time goes at 16,384 tokens of context (issue 27's
# last missed depth, 1.188x in call 2). ncu on reflex_attn_decode in one decode-graph replay after a 16,384-token
# prefill (0.6B Q8_0 shape; attn_at_depth.py), kernels serialised, caches not flushed; the step's per-launch lines and the full
# sections (warp stalls, memory, scheduler, instruction mix, source counters) in ncu-attn-16k.csv.
R=/tmp/real; Q8=$R/qwen3-0.6b-q8_0.gguf
MAKE_06B=q8_0 OUT=$OUT bash scripts/gpu_run.sh smoke 2>&1 | tail -3   # makes the file, sets up the wheels
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
timeout 420 ncu --clock-control none --cache-control none --graph-profiling node --profile-from-start off --csv --page details \
  --kernel-name regex:reflex_attn_decode --launch-count 3 \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
  --section SchedulerStats --section InstructionStats --section SourceCounters \
  --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
  python3 results/2026-12-05-h200-s34/attn_at_depth.py $Q8 16384 \
  > $OUT/ncu-attn-16k.csv 2> $OUT/ncu-attn-16k.err; echo "ncu rc $?"; grep -v "^==PROF==" $OUT/ncu-attn-16k.err | tail -4
python3 scripts/ncu_summary.py $OUT/ncu-attn-16k.csv --json $OUT/ncu-attn-16k.json | tail -5 || tail -5 $OUT/ncu-attn-16k.err
python3 - $OUT/ncu-attn-16k.csv <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head, rows = rows[0], rows[1:]
ix = {k: head.index(k) for k in ("ID", "Metric Name", "Metric Unit", "Metric Value", "Grid Size")}
by = {}
for r in rows:
    by.setdefault(r[ix["ID"]], []).append(r)
keep = ("Duration", "DRAM Throughput", "Memory Throughput", "Achieved Occupancy", "Registers Per Thread",
        "Issue Slots Busy", "No Eligible", "One or More Eligible", "Warp Cycles Per Issued Instruction",
        "Executed Ipc Active", "L1/TEX Hit Rate", "L2 Hit Rate", "Dynamic Shared Memory Per Block", "Waves Per SM")
for k, rs in by.items():
    print("launch", k, "grid", rs[0][ix["Grid Size"]])
    for r in rs:
        if r[ix["Metric Name"]] in keep:
            print("  ", r[ix["Metric Name"]], r[ix["Metric Value"]], r[ix["Metric Unit"]])
    st = [(float(r[ix["Metric Value"]].replace(",", "") or 0), r[ix["Metric Name"]]) for r in rs if "issue_stalled" in r[ix["Metric Name"]]]
    for v, n in sorted(st, reverse=True)[:9]:
        print("   stall %-70s %.2f" % (n.replace("smsp__average_warps_issue_stalled_", ""), v))
PY
