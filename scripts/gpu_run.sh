#!/usr/bin/env bash
# One session on a GPU machine with no network: everything the GPU work needs, in one command.
#
#   bash scripts/gpu_run.sh [STEPS]   STEPS: comma list of smoke,kernels,engine,real,bench,moe,coldstart,warm,decode
#
# Expects, carried from the development machine (all git-ignored):
#   .whl/                       wheels the machine lacks (../shared/tools/gpu-wheels.sh .whl)
#   reflex_runtime/_kernels/    the fatbin + manifest (python scripts/build_kernels.py; rebuilt here if stale)
#   .cache/test/llama.cpp-*/    the pinned converter (scripts/llama_cpp_sdist.py, minus models/)
#   .cache/qwen3-tokenizer/     the real Qwen3 tokenizer files
# Correctness steps may overlap each other; timing steps (bench, coldstart, warm) run alone.
# Logs and results go to $OUT (default logs/) as run.tgz plus the cold-start waterfall PNG.
set -uo pipefail
STEPS=${1:-smoke,kernels,engine,real,bench,moe,coldstart,warm}
OUT=${OUT:-logs}
WORK=$OUT/run
mkdir -p "$WORK"
has() { [[ ",$STEPS," == *",$1,"* ]]; }
QUANTS=${QUANTS:-q8_0 q4_k_m}
REAL=/tmp/real
MOE_BENCH=$REAL/qwen3moe-30b-a3b-shaped-${MOE_LAYERS:-4}l-q8_0.gguf

python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
export REFLEX_TEST_CACHE=$PWD/.cache/test REFLEX_QWEN3_TOKENIZER=$PWD/.cache/qwen3-tokenizer
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,power.draw,clocks.sm --format=csv; nproc; } \
  2>&1 | tee "$WORK/machine.txt"
python3 scripts/build_kernels.py 2>&1 | tail -1  # no-op unless kernels/*.cu changed since the carried build

# Qwen3-0.6B shapes with random weights, the real Qwen3 tokenizer, llama.cpp's converter: built in
# the background (CPU only) while the GPU tests run.
build_real() {
  for t in $QUANTS; do
    [ -f $REAL/qwen3-0.6b-$t.gguf ] || { python3 scripts/make_fixtures.py --preset qwen3-0.6b --outtype $t \
      --out $REAL/$t > "$WORK/make-$t.log" 2>&1 && cp $REAL/$t/qwen3-$t.gguf $REAL/qwen3-0.6b-$t.gguf; }
  done
  if { has moe || has decode; } && [ ! -f $MOE_BENCH ]; then  # Qwen3-30B-A3B shapes, fewer layers, random Q8_0 blocks
    python3 scripts/make_moe_bench.py --out $MOE_BENCH --layers ${MOE_LAYERS:-4} > "$WORK/make-moe.log" 2>&1
  fi
}
if has real || has bench || has moe || has coldstart || has warm || has decode; then build_real & BUILD_PID=$!; fi

if has smoke; then
  timeout 60 python3 -m reflex_runtime.cli smoke 2>&1 | tee "$WORK/smoke.log"
fi
if has kernels; then
  timeout ${KERNEL_TIMEOUT:-200} python3 -m pytest -m gpu tests/test_gpu_kernels.py tests/test_gpu_moe.py -k "not qwen3moe" \
    -q -rA -p no:cacheprovider --timeout 120 2>&1 | tee "$WORK/gpu-kernels.log" | tail -3
fi
if has engine; then
  timeout ${ENGINE_TIMEOUT:-420} python3 -m pytest -m gpu tests/test_gpu_engine.py tests/test_gpu_moe.py -k "not moe or qwen3moe" \
    -q -rA -p no:cacheprovider -n 10 --timeout 400 -p no:benchmark 2>&1 | tee "$WORK/gpu-engine.log" | grep -v "^PASSED" | tail -8
fi
[ -n "${BUILD_PID:-}" ] && { wait $BUILD_PID; ls -la $REAL | tee -a "$WORK/machine.txt"; }
if has real; then
  for t in $QUANTS; do
    timeout 300 python3 -m reflex_runtime.cli check $REAL/qwen3-0.6b-$t.gguf --steps 16 --json \
      > "$WORK/check-qwen3-0.6b-$t.json" 2> "$WORK/check-qwen3-0.6b-$t.err" &
  done
  wait
  for t in $QUANTS; do
    python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print({k: v for k, v in r.items() if 'tokens' not in k})" \
      "$WORK/check-qwen3-0.6b-$t.json" || tail -5 "$WORK/check-qwen3-0.6b-$t.err"
  done
fi
if has bench; then
  for t in ${BENCH_QUANTS:-$QUANTS}; do
    timeout 300 python3 -m reflex_runtime.cli bench $REAL/qwen3-0.6b-$t.gguf ${DEPTHS:+--depths $DEPTHS} \
      --out "$WORK/bench-qwen3-0.6b-$t.json" 2>&1 \
      | tee "$WORK/bench-qwen3-0.6b-$t.log"
  done
fi
if has moe; then
  tail -1 "$WORK/make-moe.log"
  timeout 300 python3 -m reflex_runtime.cli bench $MOE_BENCH --prefill 16,128,512 ${DEPTHS:+--depths $DEPTHS} \
    --out "$WORK/bench-qwen3moe-30b-a3b-shaped.json" \
    2>&1 | tee "$WORK/bench-qwen3moe-30b-a3b-shaped.log"
fi
if has coldstart; then
  models=(); for t in $QUANTS; do models+=(--model $REAL/qwen3-0.6b-$t.gguf); done
  peers=(); [ "${PEERS:-1}" = 1 ] && peers+=(--peer "transformers+torch=python3 scripts/peer_transformers.py $REAL/q8_0/hf")
  timeout ${COLD_TIMEOUT:-600} python3 scripts/bench_coldstart.py "${models[@]}" --runs ${RUNS:-10} --system1 ${PAIRED:+--paired} \
    --peer-runs ${PEER_RUNS:-3} --cache ${CACHES:-warm,cold} --out "$WORK/coldstart" \
    "${peers[@]}" 2>&1 | tee "$WORK/coldstart.log"
  if [ -n "${NVML_AB:-}" ]; then  # Q8_0 again with NVML started before / after the context (REFLEX_NVML_START)
    for mode in before_context after_context; do
      REFLEX_NVML_START=$mode timeout 200 python3 scripts/bench_coldstart.py --model $REAL/qwen3-0.6b-q8_0.gguf \
        --runs ${RUNS:-10} --system1 --cache warm --out "$WORK/coldstart-nvml-$mode" 2>&1 | tee "$WORK/coldstart-nvml-$mode.log"
    done
  fi
fi
if has warm; then
  timeout 200 python3 scripts/bench_warm.py --model $REAL/qwen3-0.6b-q8_0.gguf --backend cuda -n ${WARM_N:-50} \
    --out "$WORK/warm.json" 2>&1 | tail -12 | tee "$WORK/warm.log"
fi
if has decode; then  # decode kernels per candidate, whole steps per depth (DECODE_MODELS: more GGUF files)
  models=(); for t in $QUANTS; do models+=(--model $REAL/qwen3-0.6b-$t.gguf); done
  models+=(--model $MOE_BENCH); for m in ${DECODE_MODELS:-}; do models+=(--model "$m"); done
  timeout ${DECODE_TIMEOUT:-600} python3 scripts/bench_decode.py "${models[@]}" --out "$WORK/decode.json" 2>&1 \
    | tee "$WORK/decode.log"
fi
cp "$WORK"/coldstart/waterfall.png "$OUT"/ 2>/dev/null
tar czf "$OUT/run.tgz" -C "$OUT" run && rm -rf "$WORK"
echo "gpu_run.sh done: $STEPS"
