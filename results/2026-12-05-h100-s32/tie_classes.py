"""s32, after the calls: call 5's greedy comparison read with copies of LM-head rows counted as one token.
Random-weight files repeat their LM head (the 0.8B shape every 131,071 rows, the 35B-A3B shape every 16,381), so
llama.cpp's top 8 log-probs can be copies of one row and its pick any copy. Needs the two files, remade by their
makers (same seeds): python3 tie_classes.py DIR_WITH_THE_GGUFS"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import greedy_vs_llama as g  # noqa: E402

here = Path(__file__).parent / "call5-greedy-lists"
for name in ("qwen35-0.8b-q8_0", "qwen35moe-35b-a3b-q4_k_m"):
    d = json.load(open(here / f"greedy-{name}.json"))
    same = g.lm_head_rows_equal(str(Path(sys.argv[1]) / f"{name}.gguf"))
    eq = lambda a, b: a == b or same(a, b)  # noqa: E731
    period = next(t for t in range(1, 300000) if same(0, t))
    pick_is_top = sum(1 for t, lst in zip(d["llama_tokens"], d["llama_top"]) if eq(t, int(lst[0][0])))
    listed_rows = [len({min(t2 for t2, _ in lst if eq(int(t), int(t2))) for t, _ in lst}) for lst in d["llama_top"]]
    copies_of_reflex_listed = 0
    sides = {"reflex": 0, "llama": 0, "neither": 0}
    for p, lst in zip(d["positions"], d["llama_top"]):
        if p["kind"] != "differ":
            continue
        copies_of_reflex_listed += any(eq(p["reflex"], int(t)) for t, _ in lst)
        pick = p["llama_prompt_pick"]
        sides["reflex" if eq(pick, p["reflex"]) else "llama" if eq(pick, p["llama"]) else "neither"] += 1
    print(f"{name}: LM head repeats every {period} rows; llama.cpp's pick a copy of its listed top at "
          f"{pick_is_top}/{len(d['llama_tokens'])} positions; distinct rows among its top 8: min {min(listed_rows)} "
          f"max {max(listed_rows)}; at {len(d['differ'])} differing positions a copy of reflex's token listed at "
          f"{copies_of_reflex_listed}; its prompt path's pick there, copies counted: {sides}")
