"""system1 on the CPU: scores against transformers, the tree batch, bad requests, the CLI."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from reflex_runtime.api.direct_ops import parse_system1
from reflex_runtime.errors import RequestError

CANDIDATES = [" Paris", " London", " Berlin", " the city of lights", " Paris"]
PROMPT = "The capital of France is"


def engine_for(path):
    from reflex_runtime.loader import load_engine

    return load_engine(str(path), "cpu", log=lambda m: None)


def hf_scores(model, prompt_ids, cand_ids):
    """log P(candidate | prompt) from transformers: run prompt + candidate, sum its tokens' log-probs."""
    import torch

    out = []
    for cand in cand_ids:
        ids = torch.tensor([list(prompt_ids) + list(cand)])
        with torch.no_grad():
            logits = model(ids).logits[0].double()
        logp = torch.log_softmax(logits, dim=-1)
        n_p = len(prompt_ids)
        out.append(sum(float(logp[n_p - 1 + j, t]) for j, t in enumerate(cand)))
    return out


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_scores_equal_transformers_summed_logprobs(arch, fixture_paths, hf_for):
    fx = fixture_paths(arch, "f32")
    eng = engine_for(fx.gguf)
    res = eng.system1(prompt=PROMPT, candidates=CANDIDATES)
    ids = eng.prompt_ids(PROMPT)
    expect = hf_scores(hf_for(arch, "f32"), ids, [c["token_ids"] for c in res["candidates"]])
    for c, e in zip(res["candidates"], expect):
        assert abs(c["score"] - e) <= 1e-4 * max(1.0, abs(e)), (c["text"], c["score"], e)
        assert c["score"] == pytest.approx(sum(c["token_logprobs"]), abs=1e-5)
    # identical candidates, identical scores; probabilities over this set only
    assert res["candidates"][0]["score"] == res["candidates"][4]["score"]
    probs = [c["probability"] for c in res["candidates"]]
    assert sum(probs) == pytest.approx(1.0, abs=1e-12)
    assert res["best_index"] == int(np.argmax([c["score"] for c in res["candidates"]]))
    ent = -sum(p * np.log(p) for p in probs if p > 0)
    assert res["entropy"] == pytest.approx(ent)
    # the candidate text is encoded on its own, without BOS
    assert res["candidates"][1]["token_ids"] == eng.tokenizer.encode(" London", add_special=False, parse_special=False)


def test_tree_batch_equals_separate_runs(fixture_paths):
    """One pass over prompt + all candidates (tree mask) equals scoring each candidate alone."""
    from reflex_runtime.families import load_reference
    from reflex_runtime.reference.runner import ReferenceRunner, log_softmax_rows

    ref = load_reference(fixture_paths("qwen3", "f32").gguf)
    runner = ReferenceRunner(ref)
    prompt, cands = [151643, 785, 6722, 315], [[12095, 13], [7148], [20437, 3363, 11]]
    packed = runner.score(prompt, cands)
    for cand, got in zip(cands, packed):
        cache = ref.new_cache(16)
        logp = log_softmax_rows(ref.forward(prompt + cand, cache))
        alone = [float(logp[len(prompt) - 1 + j, t]) for j, t in enumerate(cand)]
        np.testing.assert_allclose(got, alone, rtol=1e-5, atol=1e-5)


def test_bad_requests_get_one_line_errors(fixture_paths, monkeypatch):
    eng = engine_for(fixture_paths("qwen3", "f32").gguf)
    cases = [
        (dict(prompt=PROMPT, candidates=[]), "candidates"),
        (dict(prompt=PROMPT, candidates=None), "candidates"),
        (dict(prompt=PROMPT, candidates=[" Paris", ""]), "candidate 1"),
        (dict(prompt=PROMPT, candidates=[" Paris", 3]), "candidate 1"),
        (dict(prompt=PROMPT, candidates=["x"] * (eng.limits.max_candidates + 1)), "exceed"),
        (dict(prompt=PROMPT, candidates=[" word" * (eng.limits.max_candidate_tokens + 1)]), "limit"),
        (dict(prompt=None, candidates=[" Paris"]), "prompt"),
    ]
    for kwargs, needle in cases:  # through the request layer, as every front end sends them
        with pytest.raises(RequestError) as e:
            req = parse_system1({k: v for k, v in kwargs.items() if v is not None}, eng.limits)
            eng.system1(req.prompt, req.candidates, req.messages, req.chat)
        msg = str(e.value)
        assert needle in msg and "\n" not in msg, msg
    # a candidate the tokenizer turns into nothing (the vocabulary decides which strings do)
    real = eng.tokenizer.encode
    monkeypatch.setattr(eng.tokenizer, "encode", lambda t, **k: [] if t == "\u2063" else real(t, **k))
    with pytest.raises(RequestError, match="encodes to no tokens"):
        eng.system1(prompt=PROMPT, candidates=[" Paris", "\u2063"])
    # and nothing was served: the engine still answers
    assert eng.system1(prompt=PROMPT, candidates=[" Paris"])["best_index"] == 0


def test_cli_on_the_embedded_model_paris_wins(tmp_path):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    r = subprocess.run([sys.executable, "-m", "reflex_runtime.cli", "system1", PROMPT, "-c", " Paris", "-c", " London",
                        "-c", " Berlin", "--backend", "cpu"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert [ln.split()[0] for ln in lines] == ["REFLEX_SYSTEM1_CANDIDATE"] * 3 + ["REFLEX_SYSTEM1_RESULT"]
    assert 'best_text=" Paris"' in lines[-1] and "process_start_to_result_ms=" in lines[-1]
    assert "not over the vocabulary" in r.stderr
    j = subprocess.run([sys.executable, "-m", "reflex_runtime.cli", "system1", PROMPT, "-c", " Paris", "-c", " London",
                        "-c", " Berlin", "--backend", "cpu", "--json"], capture_output=True, text=True, env=env, timeout=300)
    res = json.loads(j.stdout)
    assert res["best_text"] == " Paris"
    scores = {c["text"]: c["score"] for c in res["candidates"]}
    assert scores[" Paris"] > scores[" London"] and scores[" Paris"] > scores[" Berlin"]
    assert res["record"]["coldstart"]["process_start_to_first_token_ms"] == res["process_start_to_result_ms"]
    bad = subprocess.run([sys.executable, "-m", "reflex_runtime.cli", "system1", PROMPT, "-c", "", "--backend", "cpu"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == RequestError.exit_code and bad.stdout == ""
    assert bad.stderr.startswith("reflex: error:") and len(bad.stderr.strip().splitlines()) == 1
