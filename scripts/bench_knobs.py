#!/usr/bin/env python3
"""Decode tok/s and the step's role breakdown (reflex bench's) for several settings of the decode
kernels' knobs (gpu/launch.py Launcher attributes), with the model loaded once: what a big file
would cost a load per setting with `reflex bench`.

    python scripts/bench_knobs.py MODEL --set default --set "mvs_blocks_per_sm=2" \
        --set "attn_min_keys=64,mvs_budget=49152" [--tokens 64] [--repeats 3] [--out knobs.json]

Each --set is a comma list of attribute=value (ints, floats, true/false), applied on top of the
defaults; `default` is no change. Prints one line per setting and the roles whose time moved.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_setting(text: str) -> dict:
    """'a=1,b=true' -> {'a': 1, 'b': True}; 'default' -> {}."""
    out: dict = {}
    if text.strip() in ("", "default"):
        return out
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set {text!r}: {item!r} is not attribute=value")
        v = value.strip()
        out[key.strip()] = True if v == "true" else False if v == "false" else float(v) if "." in v else int(v)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--set", action="append", default=[], dest="settings")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--context", type=int, default=256, help="the breakdown's context (reflex bench: 256)")
    p.add_argument("--depths", default="", help="also decode tok/s after this many tokens of context (reflex bench --depths)")
    p.add_argument("--out")
    args = p.parse_args(argv)
    depths = [int(d) for d in args.depths.split(",") if d]
    settings = [(s, parse_setting(s)) for s in (args.settings or ["default"])]

    from reflex_runtime.commands.bench import decode_at_depths, decode_rate, role_times
    from reflex_runtime.loader import load_engine

    ctx = max(depths) + args.tokens + 16 if depths else None
    engine = load_engine(args.model, "cuda", max_context=max(ctx, 4096) if ctx else None)
    runner = engine.runner
    runner.wait_weights()
    launch = runner.launch
    base = {k: getattr(launch, k) for _, kv in settings for k in kv}
    rows = []
    for name, kv in settings:
        for k in base:
            setattr(launch, k, base[k])
        for k, v in kv.items():
            if not hasattr(launch, k):
                raise SystemExit(f"bench_knobs: the launcher has no knob {k!r}")
            setattr(launch, k, v)
        runner.reset_graphs()
        rate = decode_rate(engine, args.tokens, args.repeats)
        roles = role_times(runner, runner.decode_step_launches(args.context), 10,
                           max_replays=runner.model.max_new - args.context - 2)
        deep = decode_at_depths(runner, depths, args.tokens, args.repeats) if depths else []
        row = {"setting": name, "decode": rate, "breakdown": roles, "decode_at_depth": deep}
        # the one-kernel step (gpu/fused.py): where its time goes, op role by role (the breakdown
        # above replays the kernel-per-op launches)
        row["fused_step"] = runner.info().get("decode_fused_step")
        prof = runner.fused_profile() if row["fused_step"] is True else None
        if prof:
            row["fused_step_profile"] = prof
        rows.append(row)
        print(f"{name:<40} {rate['tok_s_median']:>8.1f} tok/s   "
              + "".join(f"@d{d['depth']} {d.get('tok_s', d.get('skipped'))}   " for d in deep) + "  ".join(
            f"{r['role']}={min(r['us'], r.get('us_pdl', r['us'])):.0f}" for r in roles), flush=True)
        for r in prof or []:
            print(f"    fused {r['role']:<44} work {r['us_work']:>7.1f} us" + (
                f"  ready {r['us_ready']:>6.1f}  barrier {r['us_barrier']:>6.1f}  ({r['ops']} ops)" if "us_ready" in r
                else ""), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"model": args.model, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
