# Prepared in s36 (one H100 call ran: results/2026-12-05-s36/README.md). Here first:
#   python3 scripts/build_kernels.py --archs 90
#   bash scripts/gpu_bundle.sh --kernels-xz --peers-apart --skeleton F --old 42e62c9   (F: embedded_model_path())
# then, back to back on one warm machine (it goes back 30 s after a call):
#   NEXT=A  carry [".gpu"]: the attention's GPU tests on the tensor-core kernels (loads one group ahead); decode by
#           depth (bench_knobs, one process, two rounds): the tile kernels, the tensor-core ones from 1,024 keys
#           (REFLEX_ATTN_TC_FROM's default), and in every graph; 42e62c9's tensor-core loop by depth   (~3 min)
#   NEXT=P  carry [".gpu"]: ncu on reflex_attn_decode_t2 at 16,384 keys (s36 call 1b: 58 us in 2.02 waves)   (~1 min)
# If A shows the tensor-core kernels faster at 1,024 keys and beyond: set REFLEX_ATTN_TC's default to 1
# (gpu/launch.py; tests/test_launch_abi.py asserts the default), rebuild and re-bundle, then
# `OUT=$OUT bash scripts/gpu_run.sh quick,tests,check` (carry [".gpu"]) and NEXT=B of
# results/2026-12-05-h100-s33/next-calls.sh (carry [".peers"]: issue 27's llama-bench rows).
case "${NEXT:-A}" in
  A) bash results/2026-12-05-s36/call3-cmd.sh ;;
  P) NEXT=P bash results/2026-12-05-s35/next-calls.sh ;;  # the same ncu command: REFLEX_ATTN_TC=1, 16,384 keys
esac
