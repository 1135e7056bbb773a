# Prepared in s30 (not run): after calls 1-2, with the winning paths' defaults set in gpu/launch.py
# (attn_short_keys 64, attn_stream 1, as measured), issue 27's same-run rows against llama-bench (s29's prepared
# call: tg128, @d1024..16384, pp128 / pp512 on the 0.6B Q8_0 / Q4_K_M and the Gemma shape, reflex check on the
# 0.6B files) -> compare.json.
# Here first: python3 scripts/build_kernels.py --archs 90
#   bash scripts/gpu_bundle.sh --peers --kernels-xz --lean --skeleton F
# carry [".gpu"]; ~300 s there.
OUT=$OUT bash results/2026-12-05-h200-s29/next-call-cmd.sh
