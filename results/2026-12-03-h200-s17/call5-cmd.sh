R=/tmp/real; M=$R/qwen3moe-30b-a3b-48l-q8_0.gguf; Q8=$R/qwen3-0.6b-q8_0.gguf
export PREFILL=128,512,2048 PEER_P=128,512,2048 BENCH_TIMEOUT=150
OUT=$OUT/t TESTS="tests/test_gpu_deepseek2.py tests/test_gpu_paged.py tests/test_gpu_batch.py tests/test_gpu_fused_step.py tests/test_gpu_kernels.py::test_attention_decode tests/test_gpu_kernels.py::test_attention_decode_with_fused_rope_and_store" MAKE_MORE="python3 scripts/make_moe_bench.py --layers 48 --out $M" TEST_TIMEOUT=150 bash scripts/gpu_run.sh tests 2>&1 | grep -v "^===" | tail -12
OUT=$OUT/a MAKE_06B= BENCH_FILES="$Q8 $M" BENCH_ARGS="--depths 4096,16384" PEER_DEPTHS=4096,16384 KNOBS_FILES="$M" KNOBS="default;mvs_waves=0,attn_head_groups=1" bash scripts/gpu_run.sh bench,peers,knobs 2>&1 | grep -v "^===" | tail -24
