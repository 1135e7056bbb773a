# s25 call 2 (here: nvcc -cubin -arch=sm_90a results/2026-12-04-h200-s25/order.cu -o results/2026-12-04-h200-s25/order.cubin;
# nothing carried but the tree): the probe of whether x waits behind weight copies issued by the same SM.
cd results/2026-12-04-h200-s25 && python3 order.py order.cubin 2>&1 | tee $OUT/order.txt
