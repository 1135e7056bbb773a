# s19 call 4 (call 3's tree; .vocab carried): the DeepSeek-V2-Lite shape vs llama-bench, reflex check on a 4-layer
# DeepSeek-shaped file, greedy vs llama-server on DeepSeek, and on four files that tell apart what made call 3's 35B-A3B
# greedy differ: 0.8B Q8_0 (hybrid dense), 35B-A3B 4 layers Q8_0 and Q4_K_M (MoE, each weight type), 0.6B Q4_K_M (K-quants, dense)
R=/tmp/real; D=$R/deepseek2-v2lite-q8_0.gguf; D4=$R/deepseek2-v2lite-4l-q8_0.gguf; S=$R/qwen35-0.8b-q8_0.gguf
H8=$R/qwen35moe-35b-a3b-4l-q8_0.gguf; H4=$R/qwen35moe-35b-a3b-4l-q4_k_m.gguf; Q4=$R/qwen3-0.6b-q4_k_m.gguf
rm -f $R/qwen3moe-30b-a3b-48l-q8_0.gguf $R/qwen35moe-35b-a3b-q4_k_m.gguf
export PREFILL=128,512,2048 PEER_P=128,512,2048 BENCH_TIMEOUT=150 GREEDY_TIMEOUT=200
MK="python3 scripts/make_qwen35_bench.py"
OUT=$OUT MAKE_06B=q4_k_m MAKE_MORE="python3 scripts/make_deepseek_bench.py --type Q8_0 --out $D && python3 scripts/make_deepseek_bench.py --type Q8_0 --layers 4 --out $D4 && $MK --model 0.8b --type q8_0 --out $S && $MK --model 35b-a3b --type q8_0 --layers 4 --out $H8 && $MK --model 35b-a3b --type q4_k_m --layers 4 --out $H4" \
  BENCH_FILES=$D BENCH_ARGS="--depths 4096" PEER_DEPTHS=4096 CHECK_FILES=$D4 GREEDY_FILES="$S $H8 $H4 $Q4 $D" \
  bash scripts/gpu_run.sh bench,peers,fidelity 2>&1 | grep -v "^===" | tail -40
