"""The `reflex` commands that measure or diagnose rather than serve: bench (warm
microbenchmarks), check (the CUDA engine against the numpy reference) and doctor (what this
machine has). cli.py dispatches to them; `reflex smoke` is gpu/smoke.py."""
