# s29 call 3 (same tree and warm machine as call 2): decode_ab again, three files, to see whether the patched
# tree's defaults are slower than main.
R=/tmp/real; OUT=$OUT AB_FILES="$R/qwen3-0.6b-q8_0.gguf $R/qwen3-0.6b-q4_k_m.gguf $R/gemma-3-270m-q4_k_m-shaped.gguf" AB_VARIANTS="win:REFLEX_MVS_HEAD_STREAM=2,REFLEX_POST_FOLD=1 hs2:REFLEX_MVS_HEAD_STREAM=2" bash scripts/gpu_run.sh decode_ab 2>&1 | grep -v "^===" | tail -8
