# s26 call 10 (the tree of fb73277 checked out over main for this call; gpu_bundle.sh --kernels-xz --lean --old d506bab;
# carry .gpu): tg128 through the engine of fb73277 with x in shared memory (new), of the same tree with it off
# (REFLEX_MVS_SHARE_X=0: the new fatbin's other path), and of d506bab (old), interleaved, on the 0.6B Q8_0 file.
R=/tmp/real
OUT=$OUT MAKE_06B=q8_0 AB_FILES="$R/qwen3-0.6b-q8_0.gguf" AB_VARIANTS="noshare:REFLEX_MVS_SHARE_X=0" \
  bash scripts/gpu_run.sh decode_ab 2>&1 | grep -v "^===" | tail -4
