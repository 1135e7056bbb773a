# s20 call 3 (call 2's warm machine: .gpu restored from there; carry .vocab alone): the DeepSeek-V2-Lite shape vs
# llama-bench with the prompt latent attention on tensor cores, and mla.cu's kernel (REFLEX_MLA_FLASH=0) in the same
# call; reflex check on a 4-layer same-shaped file, 32 greedy tokens vs llama-server on the full-size file
R=/tmp/real; D=$R/deepseek2-v2lite-q8_0.gguf; D4=$R/deepseek2-v2lite-4l-q8_0.gguf
export PREFILL=128,512,2048 PEER_P=128,512,2048 BENCH_TIMEOUT=150 GREEDY_TIMEOUT=150
EXTRA="REFLEX_MLA_FLASH=0 python3 -m reflex_runtime.cli bench $D --prefill 512,2048 --decode-tokens 16 --out \$OUT/run/bench-deepseek-mla-cuda-cores.json | grep -i 'prefill\|mla att'"
OUT=$OUT MAKE_06B= MAKE_MORE="python3 scripts/make_deepseek_bench.py --type Q8_0 --out $D && python3 scripts/make_deepseek_bench.py --type Q8_0 --layers 4 --out $D4" \
  BENCH_FILES=$D BENCH_ARGS="--depths 4096" PEER_DEPTHS=4096 CHECK_FILES=$D4 GREEDY_FILES=$D EXTRA="$EXTRA" \
  bash scripts/gpu_run.sh bench,peers,fidelity,extra 2>&1 | grep -v "^===" | tail -50
