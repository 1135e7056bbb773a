# s32 call 2, right after call 1 on the same warm machine (its .gpu is kept under /tmp/keep): carry [".peers"] alone
# (gpu_bundle.sh --peers-apart). Issue 31's last check: greedy tokens of the full-size Qwen3.5 files against
# llama-server's, with llama.cpp's own prompt path asked at every position (--llama-prompt-path), and the numpy
# reference on the 0.8B (the 35B-A3B is too big for it).
R=/tmp/real; S=$R/qwen35-0.8b-q8_0.gguf; H=$R/qwen35moe-35b-a3b-q4_k_m.gguf
export GREEDY_TIMEOUT=200 GREEDY_REFERENCE=1 GREEDY_PROMPT_PATH=1
EXTRA="timeout 240 python3 scripts/greedy_vs_llama.py $H --llama-server /tmp/peers/llama.cpp/llama-server -n 32 \
  --llama-prompt-path --out \$OUT/run/greedy-qwen35moe-35b-a3b-q4_k_m.json 2> \$OUT/run/greedy-35b.err || tail -5 \$OUT/run/greedy-35b.err"
OUT=$OUT MAKE_06B= MAKE_MORE="python3 scripts/make_qwen35_bench.py --model 0.8b --type q8_0 --out $S && python3 scripts/make_qwen35_bench.py --model 35b-a3b --type q4_k_m --out $H" \
  GREEDY_FILES=$S EXTRA="$EXTRA" bash scripts/gpu_run.sh fidelity,extra 2>&1 | grep -v "^===" | tail -30
