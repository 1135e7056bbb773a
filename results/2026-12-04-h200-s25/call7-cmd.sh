# s25 call 7 (gpu_bundle.sh --peers --kernels-xz --lean --skeleton gemma-3-270m-q4_k_m.gguf; carry .gpu): issue 27's
# rows in one GPU run against llama-bench on the same files: the 0.6B Q8_0 and Q4_K_M and the Gemma 3 270M shape,
# tg128 and tg128 after 1,024 / 4,096 / 8,192 / 16,384 tokens of context, pp128 / pp512; main 4f4b41a (the carveout).
OUT=$OUT PREFILL=128,512 PEER_P=128,512 BENCH_ARGS="--depths 1024,4096,8192,16384" PEER_DEPTHS=1024,4096,8192,16384 \
  bash scripts/gpu_run.sh bench,peers 2>&1 | grep -v "^===" | tail -40
