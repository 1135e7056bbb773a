"""Greedy tokens of reflex and llama.cpp's llama-server on the same GGUF file and prompt ids (issue
31: "greedy output equal to llama.cpp's on the full-size file for 32 tokens").

    python3 scripts/greedy_vs_llama.py FILE --llama-server PATH [-n 32] [--prompt TEXT] [--tie 0.02]
        [--reference] [--llama-prompt-path] [--llama-args "-fa off"] [--out JSON]

The prompt is tokenized once, by reflex, and both engines get the same ids. llama-server (127.0.0.1,
one slot) decodes greedily with `n_probs`, so each of its tokens comes with its own top log-probs;
reflex decodes greedily too (its free-running tokens), and then replays llama.cpp's tokens through
its decode path (teacher-forced), so every position is compared on the same context:
- same: reflex's argmax is llama.cpp's token;
- near-tie: they differ, but reflex ranks llama.cpp's token within `tie` x max|logit| of its own top
  and llama.cpp ranks reflex's top within the same distance of its own (two engines that round
  differently may each pick either: llama.cpp quantizes activations to 8 bits in its products);
- tie: they differ, but the two tokens' LM-head rows are the same bytes (random-weight files tile
  one pool of blocks, so rows repeat: equal logits in any engine; llama.cpp then picks the later id);
- differ: anything else: a real disagreement. With --reference, the numpy reference (CPU) runs the
  same teacher-forced positions and says which engine's pick it shares at each differing one.
  With --llama-prompt-path, llama-server also gets each position's context as a prompt (its tokens
  evaluated together, not one at a time): whose pick llama.cpp's own prompt path makes there.
Random-weight files have flat logits, so free-running greedy text parts at the first near-tie and
never meets again; the teacher-forced positions are the comparison that still means something after it.
Prints one line: EQUAL (free-running tokens identical), EQUAL UP TO NEAR-TIES (no `differ`
position), or DIFFERENT; exit 0 for the first two. The JSON keeps every position's gaps.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

PROMPT = "The history of the city begins"
TIE = 0.02  # of max|logit|: twice the q4_k check tolerance (reflex vs the exact reference), for two engines
# log-probs asked of llama-server a position: a random-weight file's LM head repeats (the 35B-A3B shape's every
# 16,381 rows, ~15 copies of each), so its top 8 can be one row's copies, with no other token to compare (s32)
TOP = 64


def _post(port: int, path: str, body: dict, timeout: float = 600) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _top(p: dict) -> dict:
    return {int(t["id"]): float(t["logprob"]) for t in p["top_logprobs"]}


def common_gap(a: dict, b: dict) -> float | None:
    """max |a[t] - b[t]| over the tokens both {id: logprob} maps list; None when they share none."""
    both = a.keys() & b.keys()
    return max(abs(a[t] - b[t]) for t in both) if both else None


def llama_server_greedy(exe: str, path: str, prompt: str, ids: list[int], n: int, top: int = TOP,
                        log: str | None = None, start_timeout: float = 600, extra: tuple[str, ...] = (),
                        prompt_path: bool = False) -> dict:
    """llama.cpp's greedy continuation of `ids`: {"tokens", "steps": [{id: logprob} of its top ones],
    "prompt_ids": its own tokenization of `prompt`}. prompt_path: also "prompt_steps", position j's
    top log-probs when ids + tokens[:j] is sent as a prompt (its prompt path, the tokens evaluated
    together, where "steps" come from decoding them one at a time)."""
    port = _free_port()
    ctx = max(512, len(ids) + n + 16)
    with open(log or os.devnull, "wb") as lf:
        proc = subprocess.Popen([exe, "-m", path, "-ngl", "99", "-np", "1", "-c", str(ctx), "--host", "127.0.0.1",
                                 "--port", str(port), *extra], stdout=lf, stderr=subprocess.STDOUT)
        try:
            t0 = time.monotonic()
            while True:
                if proc.poll() is not None:
                    raise SystemExit(f"llama-server exited ({proc.returncode}) before it was ready; see {log}")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() - t0 > start_timeout:
                    raise SystemExit(f"llama-server not ready after {start_timeout:.0f} s")
                time.sleep(0.5)
            theirs = _post(port, "/tokenize", {"content": prompt})["tokens"]
            ask = {"temperature": 0, "n_probs": top, "ignore_eos": True, "cache_prompt": False, "return_tokens": True}
            res = _post(port, "/completion", {"prompt": ids, "n_predict": n, **ask})
            toks = [int(p["id"]) for p in res["completion_probabilities"]]
            # n_predict 2: the first token's log-probs (the server has answered 1 without them)
            again = [_post(port, "/completion", {"prompt": ids + toks[:j], "n_predict": 2, **ask})
                     for j in range(len(toks))] if prompt_path else []
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    out = {"tokens": toks, "steps": [_top(p) for p in res["completion_probabilities"]], "prompt_ids": theirs}
    if prompt_path:  # an answer without log-probs (seen once, on a 4-layer 35B-A3B file) leaves that position empty
        out["prompt_steps"] = [_top(r["completion_probabilities"][0]) if r.get("completion_probabilities") else {}
                               for r in again]
        # and its pick there (the sampled token: any copy of the top row's, not always the first id it lists)
        out["prompt_picks"] = [int(r["completion_probabilities"][0]["id"]) if r.get("completion_probabilities") else None
                               for r in again]
        out["prompt_path_unanswered"] = [j for j, t in enumerate(out["prompt_picks"]) if t is None]
    return out


def lm_head_rows_equal(path: str):
    """same(a, b): whether tokens a and b have byte-identical LM-head rows in the file at `path`."""
    from reflex_runtime.modelfile.gguf_file import GGUFFile

    g = GGUFFile(path)
    t = g.tensors.get("output.weight") or g.tensors["token_embd.weight"]
    row = t.nbytes // t.shape[1]

    def same(a: int, b: int) -> bool:
        return bytes(g.read_tensor(t.name, a * row, row)) == bytes(g.read_tensor(t.name, b * row, row))
    return same


def compare(llama_tokens, llama_steps, rows, free_tokens, tie: float = TIE, same_rows=None) -> dict:
    """Position by position: reflex's logits `rows[i]` (teacher-forced on llama.cpp's tokens) against
    llama.cpp's token and its top log-probs there; and the two free-running sequences.
    same_rows(a, b): whether two tokens' LM-head rows are identical (lm_head_rows_equal)."""
    import numpy as np

    positions, verdicts = [], []
    for i, tok in enumerate(llama_tokens):
        row = np.asarray(rows[i], dtype=np.float64)
        ours = int(np.argmax(row))
        scale = float(np.abs(row).max()) or 1.0
        p = {"pos": i, "llama": tok, "reflex": ours}
        if ours == tok:
            kind = "same"
        elif row[ours] == row[tok] and same_rows is not None and same_rows(ours, tok):
            kind = "tie"
        else:
            p["reflex_gap"] = float(row[ours] - row[tok]) / scale  # how far below our top their token is
            lp = llama_steps[i]
            # how far below their top ours is (None: not among the top log-probs they returned); a listed
            # copy of our token's LM-head row stands for it
            mine = lp.get(ours)
            if mine is None and same_rows is not None:
                mine = next((v for t, v in lp.items() if row[t] == row[ours] and same_rows(ours, t)), None)
            p["llama_gap"] = (lp[tok] - mine) / scale if mine is not None and tok in lp else None
            near = p["reflex_gap"] <= tie and p["llama_gap"] is not None and p["llama_gap"] <= tie
            kind = "near-tie" if near else "differ"
        p["kind"] = kind
        positions.append(p)
        verdicts.append(kind)
    n_free = 0
    for a, b in zip(free_tokens, llama_tokens):
        if a != b:
            break
        n_free += 1
    equal = list(free_tokens) == list(llama_tokens)
    result = "EQUAL" if equal else ("EQUAL UP TO NEAR-TIES" if "differ" not in verdicts else "DIFFERENT")
    return {"result": result, "free_running_common_tokens": n_free, "same": verdicts.count("same"),
            "ties": [p["pos"] for p in positions if p["kind"] == "tie"],
            "near_ties": [p["pos"] for p in positions if p["kind"] == "near-tie"],
            "differ": [p["pos"] for p in positions if p["kind"] == "differ"], "tie": tie, "positions": positions}


def reference_verdicts(path: str, ids: list[int], llama_tokens: list[int], res: dict) -> None:
    """The numpy reference on the same teacher-forced positions: at each `differ` position, whose
    pick it shares ("reflex", "llama", "neither") and its own gap between the two, in res["positions"]."""
    import numpy as np

    from reflex_runtime.families import load_reference

    ref = load_reference(path)  # keeps its weights only where they fit (a 35B-A3B file's do not)
    cache = ref.new_cache(len(ids) + len(llama_tokens) + 1)
    row = ref.forward(ids, cache)[-1]
    for i, p in enumerate(res["positions"]):
        if i:
            row = ref.forward([llama_tokens[i - 1]], cache)[0]
        if p["kind"] != "differ":
            continue
        top, scale = int(np.argmax(row)), float(np.abs(row).max()) or 1.0
        p["reference"] = "reflex" if row[top] == row[p["reflex"]] else "llama" if row[top] == row[p["llama"]] else "neither"
        p["reference_top"] = top
        p["reference_gap"] = float(row[p["reflex"]] - row[p["llama"]]) / scale
    sides = [p["reference"] for p in res["positions"] if "reference" in p]
    res["reference_sides_with"] = {k: sides.count(k) for k in ("reflex", "llama", "neither")}


def prompt_path_verdicts(theirs: dict, res: dict, same_rows=None) -> None:
    """llama.cpp's prompt path (theirs["prompt_steps"]) at each position: its top token
    ("llama_prompt"), how far its log-probs are from its own decode's over the tokens both list
    ("llama_decode_vs_prompt"); and at each `differ` position whose pick its top is."""
    def same(a: int, b: int) -> bool:
        return a == b or (same_rows is not None and same_rows(a, b))

    sides, picks, worst = [], [], 0.0
    for p, dec, pro, pick in zip(res["positions"], theirs["steps"], theirs["prompt_steps"], theirs["prompt_picks"]):
        p["llama_prompt_pick"] = pick
        if p["kind"] == "differ" and pick is not None:  # a copy of a token's LM-head row is that token
            picks.append("reflex" if same(pick, p["reflex"]) else "llama" if same(pick, p["llama"]) else "neither")
        if not pro:
            p["llama_prompt"] = None
            continue
        p["llama_prompt"] = top = max(pro, key=pro.get)
        d = common_gap(dec, pro)
        p["llama_decode_vs_prompt"] = float("nan") if d is None else d
        worst = worst if d is None else max(worst, d)
        if p["kind"] == "differ":
            sides.append("reflex" if same(top, p["reflex"]) else "llama" if same(top, p["llama"]) else "neither")
    res["llama_prompt_path_sides_with"] = {k: sides.count(k) for k in ("reflex", "llama", "neither")}
    res["llama_prompt_pick_sides_with"] = {k: picks.count(k) for k in ("reflex", "llama", "neither")}
    res["llama_decode_vs_prompt_max"] = worst
    res["llama_prompt_path_unanswered"] = theirs["prompt_path_unanswered"]


def fingerprint(path: str, span: int = 16 << 20) -> str:
    """The file's size and a SHA-256 of its first and last `span` bytes: the same random-weight file remade
    elsewhere by the same maker (a full hash of 21 GB would take minutes)."""
    import hashlib

    size = os.path.getsize(path)
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(span))
        f.seek(max(0, size - span))
        h.update(f.read(span))
    return f"{size}:{h.hexdigest()[:32]}"


def reference_from(path: str, saved: str, out: str) -> int:
    """The reference's verdicts for a saved comparison (its llama.cpp tokens replayed), printed and saved."""
    with open(saved) as f:
        res = json.load(f)
    missing = [k for k in ("model", "prompt_ids", "llama_tokens", "positions", "differ") if k not in res]
    if missing:
        raise ValueError(f"{saved} is not a result this script saved with --out (no {', '.join(missing)})")
    if os.path.basename(path) != res["model"]:
        raise ValueError(f"{saved} compares {res['model']}, not {os.path.basename(path)}")
    if res.get("fingerprint") and res["fingerprint"] != fingerprint(path):
        raise ValueError(f"{path} is not the file {saved} compared (size and first / last 16 MB differ)")
    reference_verdicts(path, res["prompt_ids"], res["llama_tokens"], res)
    for p in res["positions"]:
        if "reference" in p:
            print(f"{p['pos']:3d} reflex {p['reflex']:7d} llama {p['llama']:7d} reference {p['reference_top']:7d} "
                  f"sides with {p['reference']:7s} gap reflex-llama: reflex {p['reflex_gap']:.4f} reference "
                  f"{p['reference_gap']:.4f} of max|logit|")
    print(f"{res['model']}: the reference sides with {res['reference_sides_with']} at the {len(res['differ'])} "
          f"differing positions")
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


def reflex_engine(path: str, backend: str):
    from reflex_runtime.loader import load_engine

    return load_engine(path, backend=backend)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--llama-server", help="llama-server to run (required unless --reference-from)")
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--tie", type=float, default=TIE, help="near-tie distance, a fraction of max|logit| (default %(default)s)")
    ap.add_argument("--llama-args", default="", help="more llama-server options, e.g. \"-fa off\"")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--reference", action="store_true",
                    help="at differing positions, also ask the numpy reference (CPU; small files)")
    ap.add_argument("--llama-prompt-path", action="store_true",
                    help="also send each position's context to llama-server as a prompt (its tokens evaluated "
                         "together): whose pick that path makes at the differing positions")
    ap.add_argument("--reference-from", metavar="JSON",
                    help="run no engine: add the numpy reference's verdicts to a result this script saved (--out) "
                         "for MODEL, e.g. on a CPU machine with the memory a big file needs (written to --out, "
                         "else back to JSON)")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    if a.reference_from:
        return reference_from(a.model, a.reference_from, a.out or a.reference_from)
    if not a.llama_server:
        ap.error("--llama-server is required (or --reference-from)")
    from reflex_runtime.sampling import SamplingParams

    engine = reflex_engine(a.model, a.backend)
    ids = engine.prompt_ids(a.prompt)
    free = [int(t) for t in engine.runner.generate_ids(ids, SamplingParams(), a.n, frozenset())]
    log = (a.out + ".llama-server.log") if a.out else None
    theirs = llama_server_greedy(a.llama_server, a.model, a.prompt, ids, a.n, log=log, extra=tuple(a.llama_args.split()),
                                 prompt_path=a.llama_prompt_path)
    rows = engine.runner.decode_logits(ids, theirs["tokens"][:-1])
    same_rows = lm_head_rows_equal(a.model)
    res = compare(theirs["tokens"], theirs["steps"], rows, free, a.tie, same_rows)
    if a.reference and res["differ"]:
        reference_verdicts(a.model, ids, theirs["tokens"], res)
    if a.llama_prompt_path:
        prompt_path_verdicts(theirs, res, same_rows)
    res = {"model": os.path.basename(a.model), "fingerprint": fingerprint(a.model), "prompt": a.prompt, "prompt_ids": ids,
           "same_prompt_tokenization": theirs["prompt_ids"] == ids, "tokens": a.n,
           "reflex_tokens": free, "llama_tokens": theirs["tokens"],
           "reflex_text": engine.tokenizer.decode(free), "llama_text": engine.tokenizer.decode(theirs["tokens"]), **res,
           # llama.cpp's top log-probs at each position, decode and prompt path: is its pick the top of its own list?
           "llama_top": [sorted(d.items(), key=lambda kv: -kv[1]) for d in theirs["steps"]],
           "llama_prompt_top": [sorted(d.items(), key=lambda kv: -kv[1]) for d in theirs.get("prompt_steps", [])],
           # positions where its pick's log-prob is below the top it lists (a tie between copies is not one)
           "llama_pick_below_its_listed_top": [j for j, (t, d) in enumerate(zip(theirs["tokens"], theirs["steps"]))
                                               if d and d.get(t, float("-inf")) < max(d.values())]}
    worst = max([p["reflex_gap"] for p in res["positions"] if "reflex_gap" in p], default=0.0)
    print(f"{res['model']:40s} greedy {a.n} tokens: {res['result']} (free-running common {res['free_running_common_tokens']}; "
          f"teacher-forced same {res['same']}, equal rows {len(res['ties'])}, near-ties {len(res['near_ties'])}, "
          f"differ {len(res['differ'])}; largest gap {worst:.4f} of max|logit|, tie {a.tie}; same prompt tokens: "
          f"{res['same_prompt_tokenization']}" + (f"; the reference sides with {res['reference_sides_with']}"
                                                  if "reference_sides_with" in res else "")
          + (f"; llama.cpp's prompt path picks {res['llama_prompt_pick_sides_with']}, its listed top "
             f"{res['llama_prompt_path_sides_with']}, its decode and prompt "
             f"log-probs {res['llama_decode_vs_prompt_max']:.4f} apart at most" if a.llama_prompt_path else "") + ")")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0 if res["result"] != "DIFFERENT" else 1


if __name__ == "__main__":
    from reflex_runtime.errors import ReflexError

    try:
        sys.exit(main())
    except (ReflexError, OSError, ValueError, KeyError) as e:  # a bad file, no server, an unreadable answer
        sys.exit(f"greedy_vs_llama: {e}")
