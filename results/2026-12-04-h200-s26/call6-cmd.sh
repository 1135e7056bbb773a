# s26 call 6 (carry .smolB only; .gpu and the first part kept from call 5 on the same warm machine): the wheel made
# whole, so the `full` tests (the real SmolLM2) run too; the whole GPU suite on main fb73277 (x in shared memory).
OUT=$OUT TEST_TIMEOUT=560 bash scripts/gpu_run.sh tests 2>&1 | grep -v "^===" | tail -25
