# s29 call 1: the command s28 prepared, run as is (tree: main 2c9f919 + results/2026-12-05-cpu-s28/decode-knobs.patch)
OUT=$OUT bash results/2026-12-05-cpu-s28/next-call1-cmd.sh 2>&1 | tail -90
