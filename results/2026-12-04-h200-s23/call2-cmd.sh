# s23 call 2 (gpu_bundle.sh --peers --kernels-xz --lean --vocab deepseek-llm, the llama-server addon left out to fit
# 64 MiB; carry .gpu .vocab): the prompt GEMM and grouped-expert GPU tests, then as s22 call 2: issue 31's five files
# and the 0.6B Q8_0 in one GPU run vs llama-bench (pp128/512/2048, tg128, tg128@d4096; reflex's 512-token prefill by
# role too), two passes for the 64 GB disk; reflex check on 4-layer 30B and DeepSeek files.
# Logs: $OUT/t/run.tgz (tests), $OUT/a/run.tgz, $OUT/b/run.tgz
R=/tmp/real; M=$R/qwen3moe-30b-a3b-48l-q8_0.gguf; S=$R/qwen35-0.8b-q8_0.gguf; H=$R/qwen35moe-35b-a3b-q4_k_m.gguf
D=$R/deepseek2-v2lite-q8_0.gguf; CM=$R/qwen3moe-30b-a3b-4l-q8_0.gguf; CD=$R/deepseek2-v2lite-4l-q8_0.gguf
OUT=$OUT/t MAKE_06B= TESTS="tests/test_gpu_kernels.py tests/test_gpu_moe.py -k 'gemm or tensor_core or grouped'" TEST_TIMEOUT=150 \
  bash scripts/gpu_run.sh tests 2>&1 | grep -v "^===" | grep "passed\|failed\|rror" | tail -5
export PREFILL=128,512,2048 PEER_P=128,512,2048 BENCH_TIMEOUT=150 BENCH_ARGS="--depths 4096 --prefill-breakdown 512" PEER_DEPTHS=4096
OUT=$OUT/a MAKE_MORE="python3 scripts/make_qwen35_bench.py --model 0.8b --type q8_0 --out $S && python3 scripts/make_moe_bench.py --layers 48 --out $M && python3 scripts/make_moe_bench.py --layers 4 --out $CM" \
  BENCH_FILES="$R/qwen3-0.6b-q4_k_m.gguf $R/qwen3-0.6b-q8_0.gguf $S $M" CHECK_FILES="$CM" \
  bash scripts/gpu_run.sh bench,peers,fidelity 2>&1 | grep -v "^===" | grep "ratio\|PASS\|FAIL\|rror" | tail -30
rm -f $M
OUT=$OUT/b MAKE_06B= MAKE_MORE="python3 scripts/make_qwen35_bench.py --model 35b-a3b --type q4_k_m --out $H && python3 scripts/make_deepseek_bench.py --type Q8_0 --out $D && python3 scripts/make_deepseek_bench.py --type Q8_0 --layers 4 --out $CD" \
  BENCH_FILES="$H $D" CHECK_FILES="$CD" \
  bash scripts/gpu_run.sh bench,peers,fidelity 2>&1 | grep -v "^===" | grep "ratio\|PASS\|FAIL\|rror" | tail -30
