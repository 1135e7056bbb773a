# s25 call 5 (gpu_bundle.sh --kernels-xz; carry .gpu): the shared-memory carveout of the decode graph's kernels
# (REFLEX_SMEM_CARVEOUT, Launcher.carveout: 100 = all of it, -1 = the driver's choice per kernel), A/B in one
# process per file (bench_knobs, two interleaved rounds), on the 0.6B files, the 30B-A3B and Qwen3.5-0.8B shapes;
# the quick GPU tier first.
R=/tmp/real; M=$R/qwen3moe-30b-a3b-48l-q8_0.gguf; S=$R/qwen35-0.8b-q8_0.gguf
OUT=$OUT MAKE_MORE="python3 scripts/make_qwen35_bench.py --model 0.8b --type q8_0 --out $S && python3 scripts/make_moe_bench.py --layers 48 --out $M" \
  KNOBS_FILES="$R/qwen3-0.6b-q8_0.gguf $R/qwen3-0.6b-q4_k_m.gguf $S $M" KNOBS="default;carveout=-1;default;carveout=-1" \
  bash scripts/gpu_run.sh quick,knobs 2>&1 | grep -v "^===" | tail -30
