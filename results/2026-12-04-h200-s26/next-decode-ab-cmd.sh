# Prepared in s26, not run (the device time was spent). Here: `git apply results/2026-12-04-h200-s26/share_x_v2.patch`
# (fb73277's x in shared memory, with x read by LDS from the copy and by LDG from global memory in two calls, where
# fb73277's one call on either pointer made every x load generic: 8 LD.E.128 in its SASS), then
# `python3 scripts/build_kernels.py --archs 90 && bash scripts/gpu_bundle.sh --kernels-xz --lean --old c985b5f`
# (carry .gpu); afterwards `git checkout -- kernels reflex_runtime tests` here. There: the quick GPU tier, then
# tg128 through the engine (128 tokens, 5 runs, 3 interleaved rounds) of the patched tree (new), of it with
# REFLEX_MVS_SHARE_X=0 (noshare: the plain path of the new fatbin) and of main (old), on both 0.6B files. ~260 s.
R=/tmp/real
OUT=$OUT AB_FILES="$R/qwen3-0.6b-q8_0.gguf $R/qwen3-0.6b-q4_k_m.gguf" AB_VARIANTS="noshare:REFLEX_MVS_SHARE_X=0" \
  bash scripts/gpu_run.sh quick,decode_ab 2>&1 | grep -v "^===" | tail -6
