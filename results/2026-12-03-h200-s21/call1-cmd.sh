# s21 call 1 (gpu_bundle.sh --peers --kernels-xz --lean; carry .gpu): the chunked delta rule's new chain
# (kernels/delta_net.cu) through the Qwen3.5 GPU tests, the 0.8B Q8_0 and 35B-A3B Q4_K_M shapes vs llama-bench,
# reflex check on 4-layer same-shaped files
R=/tmp/real; H=$R/qwen35moe-35b-a3b-q4_k_m.gguf; S=$R/qwen35-0.8b-q8_0.gguf
C1=$R/qwen35moe-35b-a3b-4l-q4_k_m.gguf; C2=$R/qwen35-0.8b-4l-q8_0.gguf
export PREFILL=128,512,2048 PEER_P=128,512,2048 BENCH_TIMEOUT=150 TEST_TIMEOUT=240
MK="python3 scripts/make_qwen35_bench.py"
OUT=$OUT MAKE_06B= MAKE_MORE="$MK --model 0.8b --type q8_0 --out $S && $MK --model 35b-a3b --type q4_k_m --out $H && $MK --model 35b-a3b --type q4_k_m --layers 4 --out $C1 && $MK --model 0.8b --type q8_0 --layers 4 --out $C2" \
  TESTS="tests/test_gpu_qwen35.py" BENCH_FILES="$S $H" BENCH_ARGS="--depths 4096" PEER_DEPTHS=4096 \
  CHECK_FILES="$C2 $C1" bash scripts/gpu_run.sh tests,bench,peers,fidelity 2>&1 | grep -v "^===" | tail -60
