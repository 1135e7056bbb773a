# s26 call 9 (gpu_bundle.sh --kernels-xz --lean --old d506bab; carry .gpu): tg128 as reflex bench measures it (128
# tokens through the engine, 5 runs) of this tree (fb73277) and of d506bab, interleaved, 3 rounds, on both 0.6B files.
R=/tmp/real
OUT=$OUT AB_FILES="$R/qwen3-0.6b-q8_0.gguf $R/qwen3-0.6b-q4_k_m.gguf" bash scripts/gpu_run.sh decode_ab 2>&1 | grep -v "^===" | tail -6
