# s32 calls 4 and 5 on one warm machine: the working tree (21.7 MB, results/ 20 MB of it), .gpu and .peers do not fit
# one call's 64 MiB. Call 4 (carry [".gpu"]; gpu_bundle.sh --kernels-xz --lean): the full-size Qwen3.5 files made,
# reflex check on each (the numpy reference now keeps no weights where they do not fit: the 35B-A3B's would be ~140 GB
# as float32). Call 5 (carry [".peers"]; gpu_bundle.sh --peers-apart): STEP=greedy, the greedy tokens against
# llama-server's, its top log-probs kept in the JSON (is llama.cpp's pick the top of its own list?), its prompt path
# at every position.
R=/tmp/real; S=$R/qwen35-0.8b-q8_0.gguf; H=$R/qwen35moe-35b-a3b-q4_k_m.gguf
export GREEDY_TIMEOUT=200 GREEDY_PROMPT_PATH=1 CHECK_TIMEOUT=330
if [ "${STEP:-check}" = check ]; then
  OUT=$OUT MAKE_06B= MAKE_MORE="python3 scripts/make_qwen35_bench.py --model 0.8b --type q8_0 --out $S && python3 scripts/make_qwen35_bench.py --model 35b-a3b --type q4_k_m --out $H" \
    CHECK_FILES="$S $H" bash scripts/gpu_run.sh fidelity 2>&1 | grep -v "^===" | tail -30
else
  OUT=$OUT MAKE_06B= GREEDY_FILES="$S $H" bash scripts/gpu_run.sh fidelity 2>&1 | grep -v "^===" | tail -30
fi
