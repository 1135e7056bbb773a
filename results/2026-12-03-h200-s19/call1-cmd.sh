# s19 call 1: branch s19 (main d26b747 + dn-prep): the Qwen3.5 GPU tests (both delta-rule paths, the long qwen35moe
# prompt that failed in s18 call 5), the 0.8B Q8_0 and 35B-A3B Q4_K_M shapes vs llama-bench, the delta rule's prep off
# for the A/B, reflex check on 4-layer same-shaped files, 32 greedy tokens vs llama-simple on the full-size files
R=/tmp/real; H=$R/qwen35moe-35b-a3b-q4_k_m.gguf; S=$R/qwen35-0.8b-q8_0.gguf
C1=$R/qwen35moe-35b-a3b-4l-q4_k_m.gguf; C2=$R/qwen35-0.8b-4l-q8_0.gguf
export PREFILL=128,512,2048 PEER_P=128,512,2048 BENCH_TIMEOUT=150 TEST_TIMEOUT=240
MK="python3 scripts/make_qwen35_bench.py"
EXTRA="REFLEX_DN_PREP=0 python3 -m reflex_runtime.cli bench $S --prefill 128,512,2048 --decode-tokens 32 --out \$OUT/run/bench-08b-prep-off.json | tail -25;
REFLEX_DN_PREP=0 python3 -m reflex_runtime.cli bench $H --prefill 512 --decode-tokens 32 --out \$OUT/run/bench-35b-prep-off.json | grep -i 'prefill\|delta'"
OUT=$OUT MAKE_06B= MAKE_MORE="$MK --model 0.8b --type q8_0 --out $S && $MK --model 35b-a3b --type q4_k_m --out $H && $MK --model 35b-a3b --type q4_k_m --layers 4 --out $C1 && $MK --model 0.8b --type q8_0 --layers 4 --out $C2" \
  TESTS="tests/test_gpu_qwen35.py" BENCH_FILES="$S $H" BENCH_ARGS="--depths 4096" PEER_DEPTHS=4096 \
  CHECK_FILES="$C2 $C1" GREEDY_FILES="$S $H" EXTRA="$EXTRA" bash scripts/gpu_run.sh tests,bench,peers,fidelity,extra 2>&1 | grep -v "^===" | tail -60
