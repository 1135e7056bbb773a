# s26 call 4 (gpu_bundle.sh --old fb73277 --skeleton gemma-3-270m-q4_k_m.gguf; carry .gpu and reflex_runtime/_kernels):
# the decode attention's P V with f lanes per (head, 4 dims) item where items are fewer than threads (Qwen3-0.6B:
# 64 items, f = 2); the quick GPU tier, then this tree against fb73277 (x in shared memory, the attention as before),
# bench_knobs default on each, two interleaved rounds, at 1,024, 4,096 and 16,384 tokens of context (bench_knobs puts
# this tree first on sys.path: "old" is this Python with the old fatbin, which is the A/B here: the Python is the same).
R=/tmp/real; OLDK=$PWD/.gpu/old/_kernels; [ -d $OLDK ] || OLDK=$PWD/reflex_runtime/_kernels
AB="for r in 1 2; do for f in $R/qwen3-0.6b-q8_0.gguf $R/gemma-3-270m-q4_k_m-shaped.gguf; do \
timeout 150 python3 scripts/bench_knobs.py \$f --depths 1024,4096,16384 --tokens 64 --repeats 3 | tail -1 | sed \"s|^|new \$(basename \$f) |\"; \
PYTHONPATH=\$PWD/.gpu/old:/tmp/site REFLEX_KERNELS_DIR=$OLDK timeout 150 python3 scripts/bench_knobs.py \$f --depths 1024,4096,16384 \
--tokens 64 --repeats 3 | tail -1 | sed \"s|^|old \$(basename \$f) |\"; done; done"
OUT=$OUT MAKE_06B=q8_0 EXTRA="$AB" bash scripts/gpu_run.sh quick,extra 2>&1 | grep -v "^===" | tail -16
