# s37 call B1 (carry [".gpu"]): this tree's kernels onto the machine (kept under /tmp/keep) and reflex smoke.
# B2 (carry [".peers"], the same warm machine): the 0.6B and Gemma-shaped files made; issue 27's rows, reflex bench and
# llama-bench on the same files, compare.json (tg128, tg128@d1024..16384, pp128/512).
case "${STEP:-1}" in
  1) MAKE_06B= OUT=$OUT bash scripts/gpu_run.sh smoke 2>&1 | grep -v "^===" | tail -12 ;;
  2) OUT=$OUT PREFILL=128,512 PEER_P=128,512 BENCH_ARGS="--depths 1024,4096,8192,16384" PEER_DEPTHS=1024,4096,8192,16384 \
       bash scripts/gpu_run.sh bench,peers 2>&1 | grep -v "^===" | tail -40 ;;
esac
