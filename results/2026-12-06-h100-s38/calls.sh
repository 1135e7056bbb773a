# s38's device calls, back to back on one warm machine (it goes back 30 s after a call). Here first:
#   bash scripts/gpu_bundle.sh --kernels-xz --peers-apart --skeleton F --old 2f7c6c6 --smol   (F: embedded_model_path())
#   the older results/ folders moved out of the working tree for these calls (22 MB of the 64 MiB a call carries)
#   NEXT=B  carry [".gpu", ".peers"] (first call: the wheels, kernels and converter; llama.cpp's binaries):
#           reflex check on the 0.6B files; issue 27's rows, reflex bench and llama-bench on the same files
#           (tg128, tg128@d1024..16384, pp128/512), compare.json   (~330 s)
#   NEXT=A  carry [".smolA"] (.gpu and the peers kept on the machine): the quick GPU tier on this fatbin; spawn ->
#           first token of this tree against 2f7c6c6 (tile kernels only), 10 runs each, interleaved   (~420 s)
#   NEXT=K  carry []: where the tensor cores start to win on this card (bench_knobs: the tile kernels against the
#           tensor-core ones in every graph, 2,048 .. 16,384 keys, two rounds)   (~150 s)
#   NEXT=S  carry [".smolB"]: the real SmolLM2-135M-Instruct: reflex check, greedy chat, reflex bench, llama-bench   (~150 s)
R=/tmp/real; Q8=$R/qwen3-0.6b-q8_0.gguf
case "${NEXT:-B}" in
  B) OUT=$OUT PREFILL=128,512 PEER_P=128,512 BENCH_ARGS="--depths 1024,4096,8192,16384" PEER_DEPTHS=1024,4096,8192,16384 \
       bash scripts/gpu_run.sh check,bench,peers 2>&1 | grep -v "^===" | tail -40 ;;
  A) OUT=$OUT RUNS=10 MAKE_06B=q8_0 bash scripts/gpu_run.sh quick,coldstart_ab 2>&1 | grep -v "^===" | tail -16 ;;
  K) OUT=$OUT MAKE_06B= KNOBS_FILES=$Q8 KNOBS="attn_tc=false;attn_tc_from=0;attn_tc=false;attn_tc_from=0" \
       KNOBS_ARGS="--tokens 128 --depths 2048,3072,4096,5120,6144,8192,16384" bash scripts/gpu_run.sh knobs 2>&1 \
       | grep -v "^===" | tail -5 | cut -c1-170 ;;
  S) OUT=$OUT MAKE_06B= PREFILL=128,512 PEER_P=128,512 bash scripts/gpu_run.sh smol 2>&1 | grep -v "^===" | tail -12 ;;
esac
# The prompt's split-K (kernels/gemm.cu GemmSegs.part) and its host time, after B/A/S above:
#   NEXT=P1 carry [".gpu", "reflex_runtime/_kernels"] (a fresh machine): the gemm and batch split tests, the quick
#           tier, then scripts/bench_prompt.py on the 0.6B files: splits on / off, the tensor-core kernels from 16
#           tokens, one launch's host cost   (~300 s)
#   NEXT=P2 carry [".peers"]: reflex bench and llama-bench on the same files (pp128 / pp512 in compare.json)   (~240 s)
case "${NEXT:-}" in
  P1) OUT=$OUT TESTS="tests/test_gpu_kernels.py tests/test_gpu_batch.py -k 'gemm or split'" \
        EXTRA="for t in q8_0 q4_k_m; do python3 scripts/bench_prompt.py $R/qwen3-0.6b-\$t.gguf --tokens 16,32,64,128,512 \
          --set default --set prompt_splits=false --set mm_min_tokens=16 --set mm_min_tokens=32 --launch-cost \
          --out $OUT/run/prompt-\$t.json; done" bash scripts/gpu_run.sh quick,tests,extra 2>&1 | grep -v "^===" | tail -50 ;;
  P2) OUT=$OUT PREFILL=16,128,512 PEER_P=16,128,512 BENCH_ARGS="--depths 4096" PEER_DEPTHS=4096 \
        bash scripts/gpu_run.sh bench,peers 2>&1 | grep -v "^===" | tail -30 ;;
esac
#   NEXT=P3 carry [".gpu", "reflex_runtime/_kernels"]: as P1, with MM_MIN_TOKENS 16 and the direct launch on by default;
#           "old" = MM_MIN_TOKENS 64, no prompt splits, launches through the bindings   (~300 s)
case "${NEXT:-}" in
  P3) OUT=$OUT TESTS="tests/test_gpu_kernels.py tests/test_gpu_batch.py -k 'gemm or split'" \
        EXTRA="for t in q8_0 q4_k_m; do python3 scripts/bench_prompt.py $R/qwen3-0.6b-\$t.gguf --tokens 8,16,32,64,128,512 \
          --set default --set mm_min_tokens=64,prompt_splits=false,direct_launch=false --set direct_launch=false \
          --set mm_min_tokens=8 --launch-cost --out $OUT/run/prompt-\$t.json | grep -v '^round 1'; done" \
        bash scripts/gpu_run.sh quick,tests,extra 2>&1 | grep -v "^===" | tail -60 ;;
esac
#   NEXT=P4 carry [".gpu"]: the other families' short prompts with MM_MIN_TOKENS 16 (their attention-side products on
#           tensor cores from 16 tokens; the routed experts from 64): Qwen3.5-0.8B (full size), the 30B-A3B shape with
#           8 layers, the Gemma 3 270M shape; against MM_MIN_TOKENS 64 and the split off   (~200 s)
case "${NEXT:-}" in
  P4) OUT=$OUT MAKE_06B= MAKE_MORE="python3 scripts/make_qwen35_bench.py --model 0.8b --type q8_0 --out $R/qwen35-0.8b-q8_0.gguf \
        && python3 scripts/make_moe_bench.py --layers 8 --out $R/qwen3moe-30b-a3b-8l-q8_0.gguf" \
        EXTRA="for f in qwen35-0.8b-q8_0 qwen3moe-30b-a3b-8l-q8_0 gemma-3-270m-q4_k_m-shaped; do python3 scripts/bench_prompt.py \
          $R/\$f.gguf --tokens 16,32,64,128 --set default --set mm_min_tokens=64 --set prompt_splits=false \
          --out $OUT/run/prompt-\$f.json | grep -v '^round 1'; done" bash scripts/gpu_run.sh extra 2>&1 | grep -v "^===" | tail -40 ;;
esac
