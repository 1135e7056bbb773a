# Prepared in s33 for the next session (not run). Here first:
#   python3 scripts/build_kernels.py --archs 90
#   bash scripts/gpu_bundle.sh --kernels-xz --peers-apart --skeleton F --old 480c6c3   (F: embedded_model_path())
# then NEXT=A, B, C as three calls back to back on one warm machine (the machine goes back 30 s after a call).
#   NEXT=A  carry [".gpu"]:   the 0.6B files made; the quick GPU tier (the engine tests with the landed merge); cold start of this tree against 480c6c3 (the fatbin has the 11
#           reflex_mvs_merge_* kernels more: issue 27 asks for n >= 10 before and after), on the 0.6B Q8_0 and on
#           the Gemma 3 270M shape (the file that merges); ncu on the merging and the plain projection kernel in
#           the 0.6B step with the merge forced on (PERFORMANCE_NOTES s33: ~1.6 us a launch more, merging or not)
#   NEXT=B  carry [".peers"]: issue 27's llama-bench rows (s32's next-calls.sh B: tg128, @d1024..16384, pp128/512)
#   NEXT=C  carry []:         issue 31's greedy check on the full-size Qwen3.5 files (s32's next-calls.sh C)
#   NEXT=D  (a call of its own, tree with one-kernel.patch applied: `git apply results/2026-12-05-h100-s33/one-kernel.patch`,
#           then build + bundle with --old main as above; carry [".gpu"]): does the merging kernel's ~1.6 us a
#           launch on the 0.6B go away when q/k/v, the projection and down all run its code (REFLEX_MVS_ONE_KERNEL=1:
#           every one-type segments launch through reflex_mvs_merge_*, its plain path taking the pre-norm)? The
#           patch passes the CPU emulation (staged segments with and without the norm, 3 segments, the merges).
R=/tmp/real
G=$R/gemma-3-270m-q4_k_m-shaped.gguf
case "${NEXT:-A}" in
  A) mkdir -p $OUT/cold $OUT/prof  # two gpu_run.sh runs: each leaves its own run.tgz
     OUT=$OUT/cold RUNS=10 EXTRA="timeout 150 python3 scripts/bench_coldstart.py --model $G --runs 10 --cache warm \
       --tree new=\$PWD --tree old=\$PWD/.gpu/old:\$PWD/.gpu/old/_kernels --out \$OUT/run/coldstart-gemma" \
       bash scripts/gpu_run.sh quick,coldstart_ab,extra 2>&1 | grep -v "^===" | tail -20
     OUT=$OUT/prof MAKE_06B= REFLEX_ATTN_OUT_MERGE_K=65536 REFLEX_ATTN_OUT_MERGE=1 PROFILE_COUNT=16 PROFILE_SKIP=600 \
       PROFILE_KERNELS="reflex_mvs_merge_q8_0|reflex_mvs_q8_0" PROFILE_NCU_ARGS="--cache-control none" \
       bash scripts/gpu_run.sh profile 2>&1 | grep -v "^===" | tail -20 ;;
  B|C) NEXT=$NEXT OUT=$OUT bash results/2026-12-05-h100-s32/next-calls.sh ;;
  D) OUT=$OUT AB_FILES="$R/qwen3-0.6b-q8_0.gguf $R/qwen3-0.6b-q4_k_m.gguf $G" \
       AB_VARIANTS="one:REFLEX_MVS_ONE_KERNEL=1,REFLEX_ATTN_OUT_MERGE_K=65536 onenomerge:REFLEX_MVS_ONE_KERNEL=1,REFLEX_ATTN_OUT_MERGE=0 wide:REFLEX_ATTN_OUT_MERGE_K=65536" \
       KNOBS_FILES=$R/qwen3-0.6b-q8_0.gguf KNOBS="default;mvs_one_kernel=true,attn_out_merge_k=65536;mvs_one_kernel=true,attn_out_merge=0" \
       KNOBS_ARGS="--tokens 128" bash scripts/gpu_run.sh decode_ab,knobs 2>&1 | grep -v "^===" | tail -20 ;;
esac
