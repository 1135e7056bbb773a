# Prepared in s39 for the next session (s39 had no device time: s38's try, cut off, had spent it). Here first:
#   F=$(python3 -c "from reflex_runtime.modelfile.embedded import embedded_model_path as e; print(e())")
#   bash scripts/gpu_bundle.sh --kernels-xz --peers-apart --skeleton $F --old 1e11a80
#   mkdir -p .gpu/old/scripts && cp scripts/bench_prompt.py scripts/bench_knobs.py .gpu/old/scripts/
#   mv .peers/llama-server-sm90-addon.tar.xz /tmp/   (B does not need it; with it the tree and .peers pass 64 MiB)
#   and, if a call says the tree is over 64 MiB, move the older results/ folders out for the calls (s38 did)
# 1e11a80 is main before s39: the same kernels (s39 changed no .cu), the host path before s39's change.
# Then, back to back on one warm machine (it goes back 30 s after a call), an H200 if one comes (issue 27 names one):
#   NEXT=A  carry [".gpu"]: the whole -m gpu suite (it has not run whole since 310b915, the routed experts' grouped
#           kernels from 16 prompt tokens: s38's call 14 ran 90% of the MoE / Qwen3.5 / DeepSeek / batch tests,
#           none failed) and reflex check on both 0.6B files   (~7 min)
#   NEXT=B  carry [".peers"]: issue 27's rows against llama-bench on the same files (tg128, tg128@d1024..16384),
#           and pp16 / pp128 / pp512 with s39's host path, compare.json   (~6 min)
#   NEXT=H  carry []: s39's host path against 1e11a80's on this machine's CPU and GPU, interleaved, two rounds:
#           bench_prompt.py (eager ms with the host's launches, host enqueue ms, the graph's GPU ms, one launch's
#           host cost) on the 0.6B Q8_0 and the Gemma 3 270M shape at 16 / 32 / 128 tokens, and bench_host.py (the
#           host's side alone, driver stubbed)   (~3 min)
#   NEXT=C  carry []: spawn -> first token (0.6B Q8_0, warm page cache, 8 runs a case, interleaved) with the weights
#           through the staging ring (default), from the mapping (REFLEX_UPLOAD_MAPPED=1, s39, off by default; 8 and 4
#           threads), and the ring at 4 threads x 8 MB; `reflex check` with the mapped upload (its weights must be the file's).
#           Read each case's upload_ms and tokenizer mark in the records: on s38's H100 the 633 MB went up at
#           6.4 GB/s beside the tokenizer (374 -> 473 ms) and the tokenizer took 188 ms (~70 alone)   (~6 min)
# Issue 31's rows (the six files in one run) on an H200: results/2026-12-04-h200-s23/call4-cmd.sh shows the
# command; its greedy check: NEXT=C of results/2026-12-06-h100-s37/next-calls.sh.
R=/tmp/real; Q8=$R/qwen3-0.6b-q8_0.gguf
case "${NEXT:-A}" in
  A) OUT=$OUT bash scripts/gpu_run.sh tests,check 2>&1 | grep -v "^===" | tail -24 ;;
  B) OUT=$OUT PREFILL=16,128,512 PEER_P=16,128,512 BENCH_ARGS="--depths 1024,4096,8192,16384" \
       PEER_DEPTHS=1024,4096,8192,16384 bash scripts/gpu_run.sh bench,peers 2>&1 | grep -v "^===" | tail -40 ;;
  H) OUT=$OUT MAKE_06B=q8_0 EXTRA="for i in 1 2; do for t in old new; do S=scripts; K=; \
       [ \$t = old ] && S=.gpu/old/scripts && K=REFLEX_KERNELS_DIR=\$PWD/reflex_runtime/_kernels; \
       for f in qwen3-0.6b-q8_0 gemma-3-270m-q4_k_m-shaped; do env \$K python3 \$S/bench_prompt.py $R/\$f.gguf \
       --tokens 16,32,128 --rounds 1 --repeats 10 --launch-cost --out \$OUT/run/prompt-\$t-\$f-\$i.json \
       | sed \"s/^/\$t \$f: /\"; done; T=\$PWD; [ \$t = old ] && T=\$PWD/.gpu/old; python3 scripts/bench_host.py \
       $R/gemma-3-270m-q4_k_m-shaped.gguf --tokens 16,128 --tree \$T --out \$OUT/run/host-\$t-\$i.json 2>&1 \
       | grep " tokens: " | sed \"s/^/\$t: /\"; done; done" bash scripts/gpu_run.sh extra 2>&1 | grep -v "^===" | tail -40 ;;
  C) OUT=$OUT MAKE_06B=q8_0 RUNS=8 COLD_TIMEOUT=420 \
       COLD_VARIANTS="mapped:REFLEX_UPLOAD_MAPPED=1 mapped4:REFLEX_UPLOAD_MAPPED=1,REFLEX_UPLOAD_THREADS=4 t4c8:REFLEX_UPLOAD_THREADS=4,REFLEX_UPLOAD_CHUNK_MB=8" \
       EXTRA="REFLEX_UPLOAD_MAPPED=1 python3 -m reflex_runtime.cli check $Q8 --steps 16 --json > \$OUT/run/check-mapped.json \
       && python3 -c \"import json; r=json.load(open('\$OUT/run/check-mapped.json')); print('mapped check', r['result'], \
       r['greedy_mismatches'])\"" bash scripts/gpu_run.sh extra,coldstart 2>&1 | grep -v "^===" | tail -30 ;;
esac
