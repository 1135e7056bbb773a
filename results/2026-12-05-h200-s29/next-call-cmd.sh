# Prepared in s29 for the next session (not run): issue 27's rows with this main's defaults (the streamed LM head,
# the folded post-norms) in one GPU run against llama-bench on the same files, written to compare.json (tg128,
# tg128@d1024..16384, pp128/512 on the 0.6B Q8_0 and Q4_K_M and the Gemma 3 270M shape), with reflex check on
# the 0.6B files. Here first: python3 scripts/build_kernels.py --archs 90;
#   bash scripts/gpu_bundle.sh --peers --kernels-xz --lean --skeleton F   (F: embedded_model_path(), as in s29)
# carry [".gpu"]; ~300 s there (s26's call 7 did this and more in one call).
OUT=$OUT PREFILL=128,512 PEER_P=128,512 BENCH_ARGS="--depths 1024,4096,8192,16384" PEER_DEPTHS=1024,4096,8192,16384 \
  bash scripts/gpu_run.sh check,bench,peers 2>&1 | grep -v "^===" | tail -40
