"""scripts/greedy_vs_llama.py without a GPU: the position-by-position verdicts (same, near-tie,
differ), and the llama-server client against a stand-in server on 127.0.0.1 (the reflex side needs
the GPU: gpu_run.sh step fidelity)."""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "greedy_vs_llama.py"
spec = importlib.util.spec_from_file_location("greedy_vs_llama", SCRIPT)
g = importlib.util.module_from_spec(spec)
spec.loader.exec_module(g)


def _row(vocab, top, second=None, gap=0.0):
    r = np.linspace(-1.0, 0.0, vocab)  # max|logit| 1: gaps read as fractions of it
    r[top] = 5.0
    if second is not None:
        r[second] = 5.0 - gap
    return r / 5.0


def test_identical_greedy_is_equal():
    rows = [_row(16, t) for t in (3, 7, 1)]
    steps = [{3: -0.1}, {7: -0.2}, {1: -0.1}]
    res = g.compare([3, 7, 1], steps, rows, [3, 7, 1])
    assert res["result"] == "EQUAL" and res["same"] == 3 and res["free_running_common_tokens"] == 3


def test_a_close_second_in_both_engines_is_a_near_tie_and_later_positions_still_count():
    # position 1: we prefer 7 over their 9 by 0.5% of max|logit|; they prefer 9 over our 7 by 0.4%
    rows = [_row(16, 3), _row(16, 7, 9, gap=0.025), _row(16, 2)]
    steps = [{3: -0.1}, {9: -0.690, 7: -0.692}, {2: -0.1}]
    res = g.compare([3, 9, 2], steps, rows, [3, 7, 5])
    assert res["result"] == "EQUAL UP TO NEAR-TIES"
    assert res["near_ties"] == [1] and res["differ"] == [] and res["free_running_common_tokens"] == 1
    p = res["positions"][1]
    assert p["reflex_gap"] == pytest.approx(0.005) and p["llama_gap"] == pytest.approx(0.002)


@pytest.mark.parametrize("gap,their_lp,why", [
    (0.5, {9: -0.1, 7: -0.11}, "we rank their token far below ours"),
    (0.025, {9: -0.1, 7: -3.0}, "they rank ours far below theirs"),
    (0.025, {9: -0.1}, "ours is not among their top log-probs"),
])
def test_a_real_disagreement_is_different(gap, their_lp, why):
    rows = [_row(16, 7, 9, gap=gap)]
    res = g.compare([9], [their_lp], rows, [7])
    assert res["result"] == "DIFFERENT" and res["differ"] == [0], why


def test_llama_server_client_sends_the_ids_and_reads_its_log_probs(tmp_path):
    """A stand-in llama-server (python, 127.0.0.1): /health, /tokenize, /completion as llama.cpp's
    server answers them (completion_probabilities with top_logprobs); the request it got is checked."""
    seen = tmp_path / "request.json"
    server = tmp_path / "llama-server"
    server.write_text(f"""#!{sys.executable}
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
port = int(sys.argv[sys.argv.index("--port") + 1])
assert sys.argv[sys.argv.index("--host") + 1] == "127.0.0.1"
assert sys.argv[-2:] == ["-fa", "off"]
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def _send(self, obj):
        b = json.dumps(obj).encode(); self.send_response(200); self.send_header("Content-Length", str(len(b)))
        self.end_headers(); self.wfile.write(b)
    def do_GET(self): self._send({{"status": "ok"}})
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize": return self._send({{"tokens": [11, 12]}})
        open({str(seen)!r}, "w").write(json.dumps(body))
        probs = [{{"id": t, "logprob": -0.1, "top_logprobs": [{{"id": t, "logprob": -0.1}}, {{"id": 0, "logprob": -2.5}}]}}
                 for t in (5, 6, 7)[:body["n_predict"]]]
        if body["prompt"] == [11, 12, 5, 6]:  # the last prompt-path request: answered without log-probs
            return self._send({{"content": "x"}})
        self._send({{"content": "x", "completion_probabilities": probs}})
HTTPServer(("127.0.0.1", port), H).serve_forever()
""")
    server.chmod(0o755)
    out = g.llama_server_greedy(str(server), "m.gguf", "Hi there", [11, 12], 3, log=str(tmp_path / "s.log"),
                                start_timeout=30, extra=("-fa", "off"))
    assert out["tokens"] == [5, 6, 7] and out["prompt_ids"] == [11, 12]
    assert out["steps"][0] == {5: -0.1, 0: -2.5}
    req = json.loads(seen.read_text())
    assert req["prompt"] == [11, 12] and req["temperature"] == 0 and req["n_probs"] >= 2 and req["ignore_eos"]
    # llama.cpp's prompt path: each position's context sent as a prompt, its first token's log-probs
    out = g.llama_server_greedy(str(server), "m.gguf", "Hi there", [11, 12], 3, log=str(tmp_path / "s.log"),
                                start_timeout=30, extra=("-fa", "off"), prompt_path=True)
    assert out["tokens"] == [5, 6, 7] and out["prompt_steps"] == [{5: -0.1, 0: -2.5}] * 2 + [{}]
    assert out["prompt_path_unanswered"] == [2] and out["prompt_picks"] == [5, 5, None]
    req = json.loads(seen.read_text())  # the last one: the context of position 2
    assert req["prompt"] == [11, 12, 5, 6] and req["n_predict"] == 2 and not req["cache_prompt"]


def test_a_prompt_path_answer_without_log_probs_leaves_its_position_empty():
    """Once (a 4-layer 35B-A3B file, s32) llama-server answered a prompt-path request without
    completion_probabilities: that position has no prompt-path verdict; the others keep theirs."""
    res = {"positions": [{"pos": 0, "llama": 5, "reflex": 5, "kind": "same"},
                         {"pos": 1, "llama": 6, "reflex": 9, "kind": "differ"}]}
    theirs = {"steps": [{5: -0.1}, {6: -0.2, 9: -1.9}], "prompt_steps": [{5: -0.1}, {}],
              "prompt_path_unanswered": [1], "prompt_picks": [5, None]}
    g.prompt_path_verdicts(theirs, res)
    assert [p["llama_prompt"] for p in res["positions"]] == [5, None]
    assert res["llama_prompt_path_sides_with"] == {"reflex": 0, "llama": 0, "neither": 0}
    assert res["llama_prompt_path_unanswered"] == [1]


def test_the_prompt_path_says_whose_pick_it_makes():
    """At a differing position, llama.cpp's prompt path may make reflex's pick while its decode did not."""
    res = {"positions": [{"pos": 0, "llama": 5, "reflex": 5, "kind": "same"},
                         {"pos": 1, "llama": 6, "reflex": 9, "kind": "differ"},
                         {"pos": 2, "llama": 7, "reflex": 8, "kind": "differ"}]}
    theirs = {"steps": [{5: -0.1, 1: -3.0}, {6: -0.2, 9: -1.9}, {7: -0.3, 8: -1.0}],
              "prompt_steps": [{5: -0.1, 1: -3.0}, {9: -0.15, 6: -2.0}, {7: -0.35, 8: -1.1}],
              "prompt_path_unanswered": [], "prompt_picks": [5, 9, 4]}  # position 2: a pick it does not list first
    g.prompt_path_verdicts(theirs, res)
    assert [p["llama_prompt"] for p in res["positions"]] == [5, 9, 7]
    assert res["llama_prompt_path_sides_with"] == {"reflex": 1, "llama": 1, "neither": 0}
    assert res["llama_prompt_pick_sides_with"] == {"reflex": 1, "llama": 0, "neither": 1}
    assert abs(res["llama_decode_vs_prompt_max"] - 1.8) < 1e-9


def test_a_llama_server_that_dies_is_one_line(tmp_path):
    server = tmp_path / "llama-server"
    server.write_text("#!/bin/sh\necho 'failed to load model' >&2\nexit 1\n")
    server.chmod(0o755)
    with pytest.raises(SystemExit) as e:
        g.llama_server_greedy(str(server), "m.gguf", "p", [1], 2, log=str(tmp_path / "s.log"), start_timeout=30)
    assert "llama-server exited (1)" in str(e.value)
    assert "failed to load model" in (tmp_path / "s.log").read_text()


def test_equal_lm_head_rows_are_a_tie_not_a_disagreement():
    """Random-weight files tile one pool of blocks, so LM-head rows repeat: their logits are equal in
    any engine and the two engines' argmax breaks the tie differently (llama.cpp: the later id)."""
    row = _row(16, 3)
    row[11] = row[3]
    res = g.compare([11], [{11: -0.1}], [row], [3], same_rows=lambda a, b: {a, b} == {3, 11})
    assert res["result"] == "EQUAL UP TO NEAR-TIES" and res["ties"] == [0] and res["differ"] == []
    # equal logits from rows that are not the same bytes are not excused this way
    res = g.compare([11], [{11: -0.1}], [row], [3], same_rows=lambda a, b: False)
    assert res["differ"] == [0]


def test_a_listed_copy_of_our_row_stands_for_our_token():
    """llama.cpp's top log-probs may list only copies of rows (a random-weight 35B-A3B shape repeats its
    LM head every 16,381 rows): a listed token whose row is ours gives our log-prob, so a near-tie is
    still told from a disagreement; the prompt path's pick of a copy is that token's pick."""
    row = _row(16, 7, 9, gap=0.025)
    row[12] = row[7]  # 12 is a copy of our 7; they list 12, not 7
    copies = lambda a, b: {a, b} == {7, 12}  # noqa: E731
    res = g.compare([9], [{9: -0.690, 12: -0.692}], [row], [7], same_rows=copies)
    assert res["near_ties"] == [0] and res["positions"][0]["llama_gap"] == pytest.approx(0.002)
    res = g.compare([9], [{9: -0.690, 12: -0.692}], [row], [7])  # without the rows: not listed
    assert res["differ"] == [0] and res["positions"][0]["llama_gap"] is None
    res = {"positions": [{"pos": 0, "llama": 9, "reflex": 7, "kind": "differ"}]}
    theirs = {"steps": [{9: -0.1}], "prompt_steps": [{12: -0.1}], "prompt_path_unanswered": [], "prompt_picks": [12]}
    g.prompt_path_verdicts(theirs, res, copies)
    assert res["llama_prompt_pick_sides_with"] == {"reflex": 1, "llama": 0, "neither": 0}
    assert res["llama_prompt_path_sides_with"] == {"reflex": 1, "llama": 0, "neither": 0}


def test_lm_head_rows_equal_reads_the_file(tmp_path):
    gguf = pytest.importorskip("gguf")
    w = np.arange(5 * 8, dtype=np.float32).reshape(5, 8)
    w[4] = w[1]
    path = tmp_path / "m.gguf"
    wr = gguf.GGUFWriter(str(path), "llama")
    wr.add_tensor("output.weight", w)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    same = g.lm_head_rows_equal(str(path))
    assert same(1, 4) and same(2, 2) and not same(0, 1) and not same(3, 4)


def _fake_reference(monkeypatch, fed: list, loaded: list):
    import reflex_runtime.families as fam

    class Ref:
        def new_cache(self, n):
            return None

        def forward(self, toks, cache):
            fed.append(list(toks))
            return [_row(16, 7 if len(fed) == 1 else 9)]  # position 0: reflex's 7; position 1: llama's 9

    monkeypatch.setattr(fam, "load_reference", lambda path: loaded.append(path) or Ref())


def test_the_reference_says_whose_pick_it_shares(monkeypatch):
    """reference_verdicts feeds the reference the same teacher-forced tokens and, at each differing
    position, names the engine whose pick it shares."""
    fed, loaded = [], []
    _fake_reference(monkeypatch, fed, loaded)
    rows = [_row(16, 7, 9, gap=0.5), _row(16, 7, 9, gap=0.5)]
    res = g.compare([9, 9], [{9: -0.1}, {9: -0.1}], rows, [7, 7])
    g.reference_verdicts("m.gguf", [1, 2], [9, 9], res)
    assert fed == [[1, 2], [9]] and loaded == ["m.gguf"]
    assert [p["reference"] for p in res["positions"]] == ["reflex", "llama"]
    assert [p["reference_top"] for p in res["positions"]] == [7, 9]
    assert res["reference_sides_with"] == {"reflex": 1, "llama": 1, "neither": 0}


def test_reference_from_a_saved_result_needs_no_engine(monkeypatch, tmp_path, capsys):
    """--reference-from: the reference's verdicts for a comparison saved on the GPU machine (for a file too
    big for the reference there), with the same teacher-forced tokens, saved back to --out."""
    fed = []
    _fake_reference(monkeypatch, fed, [])
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    rows = [_row(16, 7, 9, gap=0.5), _row(16, 7, 9, gap=0.5)]
    saved = {"model": "m.gguf", "prompt_ids": [1, 2], "llama_tokens": [9, 9],
             **g.compare([9, 9], [{9: -0.1}, {9: -0.1}], rows, [7, 7])}
    (tmp_path / "saved.json").write_text(json.dumps(saved))
    assert g.main([str(model), "--reference-from", str(tmp_path / "saved.json"), "--out", str(tmp_path / "r.json")]) == 0
    assert fed == [[1, 2], [9]]
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["reference_sides_with"] == {"reflex": 1, "llama": 1, "neither": 0}
    assert "sides with {'reflex': 1, 'llama': 1, 'neither': 0}" in capsys.readouterr().out
    (tmp_path / "other.json").write_text(json.dumps({"model": "m.gguf"}))
    with pytest.raises(ValueError, match="not a result this script saved .*no prompt_ids"):
        g.main([str(model), "--reference-from", str(tmp_path / "other.json")])
    # a result saved for another file is refused, not compared: by name, and by content where it kept a fingerprint
    with pytest.raises(ValueError, match="compares m.gguf"):
        g.main([str(tmp_path / "other.gguf"), "--reference-from", str(tmp_path / "saved.json")])
    saved["fingerprint"] = g.fingerprint(str(model))
    (tmp_path / "saved.json").write_text(json.dumps(saved))
    assert g.main([str(model), "--reference-from", str(tmp_path / "saved.json"), "--out", str(tmp_path / "r.json")]) == 0
    model.write_bytes(b"y")  # the same name and size, other bytes
    with pytest.raises(ValueError, match="is not the file"):
        g.main([str(model), "--reference-from", str(tmp_path / "saved.json")])


def test_the_llama_server_option_is_required_for_a_comparison():
    with pytest.raises(SystemExit):
        g.main(["m.gguf"])
