# s20 call 1 (gpu_bundle.sh --kernels-xz: llguidance for the constrained tests): the whole GPU suite on this tree
# (kernels/mla_flash.cu new, its tests and the v3_wide fixture; s19's delta_net.cu refactor first run here)
OUT=$OUT TEST_TIMEOUT=560 bash scripts/gpu_run.sh tests 2>&1 | grep -v "^===" | tail -40
