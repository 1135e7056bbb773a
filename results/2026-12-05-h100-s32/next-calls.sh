# Prepared in s32 for the next session (not run). Three calls back to back on one warm machine; here first:
#   python3 scripts/build_kernels.py --archs 90
#   bash scripts/gpu_bundle.sh --kernels-xz --lean --peers-apart --skeleton F   (F: embedded_model_path())
# The tree (21.7 MB), .gpu (~8 MB) and llama.cpp's binaries (43 MB) do not fit one call's 64 MiB.
#   NEXT=A  carry [".gpu"]:   the 0.6B and Gemma-shaped files made, reflex check on the 0.6B files (~200 s)
#   NEXT=B  carry [".peers"]: issue 27's rows, reflex bench and llama-bench on the same files, compare.json
#           (tg128, tg128@d1024..16384, pp128/512: what s29's next-call-cmd.sh did in one call) (~250 s)
#   NEXT=C  carry []:         issue 31's greedy check again with 64 log-probs a position and LM-head copies
#           counted as one token (s32's script), on the full-size Qwen3.5 files (~120 s)
R=/tmp/real
case "${NEXT:-A}" in
  A) OUT=$OUT bash scripts/gpu_run.sh check 2>&1 | grep -v "^===" | tail -20 ;;
  B) OUT=$OUT PREFILL=128,512 PEER_P=128,512 BENCH_ARGS="--depths 1024,4096,8192,16384" PEER_DEPTHS=1024,4096,8192,16384 \
       bash scripts/gpu_run.sh bench,peers 2>&1 | grep -v "^===" | tail -40 ;;
  C) S=$R/qwen35-0.8b-q8_0.gguf; H=$R/qwen35moe-35b-a3b-q4_k_m.gguf
     OUT=$OUT MAKE_06B= GREEDY_PROMPT_PATH=1 GREEDY_TIMEOUT=200 GREEDY_FILES="$S $H" \
       MAKE_MORE="python3 scripts/make_qwen35_bench.py --model 0.8b --type q8_0 --out $S && python3 scripts/make_qwen35_bench.py --model 35b-a3b --type q4_k_m --out $H" \
       bash scripts/gpu_run.sh fidelity 2>&1 | grep -v "^===" | tail -20 ;;
esac
