# s19 call 5 (call 3's kernels; greedy_vs_llama.py telling equal LM-head rows apart, --reference): the Qwen3.5-0.8B shape
# vs llama-bench with this session's GEMMs and delta rule; greedy vs llama-server with the numpy reference's verdicts on
# the 0.8B and a 4-layer 35B-A3B Q4_K_M file (call 4: both DIFFERENT)
R=/tmp/real; S=$R/qwen35-0.8b-q8_0.gguf; H4=$R/qwen35moe-35b-a3b-4l-q4_k_m.gguf
export PREFILL=128,512,2048 PEER_P=128,512,2048 BENCH_TIMEOUT=150 GREEDY_TIMEOUT=150 GREEDY_REFERENCE=1
MK="python3 scripts/make_qwen35_bench.py"
OUT=$OUT MAKE_06B= MAKE_MORE="$MK --model 0.8b --type q8_0 --out $S && $MK --model 35b-a3b --type q4_k_m --layers 4 --out $H4" \
  BENCH_FILES=$S BENCH_ARGS="--depths 4096" PEER_DEPTHS=4096 GREEDY_FILES="$S $H4" \
  bash scripts/gpu_run.sh bench,peers,fidelity 2>&1 | grep -v "^===" | tail -30
