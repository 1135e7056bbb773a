"""Sampling defaults (issue 29): a field a request leaves out takes the model file's
`general.sampling.*` recommendation, else reflex's greedy default, on every front end; /v1/models,
the record and the CLI say which values applied."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from reflex_runtime import sampling_defaults
from reflex_runtime.api.direct_ops import parse_generate
from reflex_runtime.errors import ModelFileError

from fake_engine import make_engine
from front_ends import KEY, fronts_maker
from gguf_edit import VT, GGUFModel

AUTH = "Bearer " + KEY
RECOMMENDED = {"general.sampling.temp": 0.7, "general.sampling.top_k": 20, "general.sampling.top_p": 0.8,
               "general.sampling.penalty_repeat": 1.1}
GREEDY = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}


def _gguf(meta: dict):
    return SimpleNamespace(path="/nonexistent/fake.gguf", get=meta.get)


def _engine(meta: dict):
    e = make_engine()
    e.sampling_defaults = sampling_defaults.from_gguf(_gguf(meta))
    return e


def test_the_file_recommends_what_it_has_and_reflex_the_rest():
    d = sampling_defaults.from_gguf(_gguf(RECOMMENDED))
    p = d.params
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.seed) == (0.7, 20, 0.8, 0.0, None)
    assert d.from_model == ("temperature", "top_k", "top_p")
    assert d.not_applied == ("general.sampling.penalty_repeat",)
    card = d.describe()
    assert card["source"] == {"temperature": "model", "top_k": "model", "top_p": "model", "min_p": "reflex"}
    assert card["not_applied"] == ["general.sampling.penalty_repeat"]
    note = d.notice()
    assert "temperature=0.7 top_k=20 top_p=0.8" in note and "penalty_repeat" in note and "\n" not in note
    assert sampling_defaults.from_gguf(_gguf({})).notice() is None
    assert sampling_defaults.from_gguf(_gguf({})).params == sampling_defaults.REFLEX_DEFAULTS


def test_float32_values_read_as_written_and_k_off_as_in_llama_cpp():
    import struct

    f32 = struct.unpack("<f", struct.pack("<f", 0.95))[0]  # what a GGUF float32 reads back as
    assert f32 != 0.95
    d = sampling_defaults.from_gguf(_gguf({"general.sampling.top_p": f32, "general.sampling.top_k": -1}))
    assert d.params.top_p == 0.95 and d.params.top_k == 0


@pytest.mark.parametrize("key, value", [
    ("general.sampling.temp", "hot"), ("general.sampling.temp", float("nan")), ("general.sampling.temp", -0.5),
    ("general.sampling.temp", 1e9), ("general.sampling.top_p", 0.0), ("general.sampling.top_p", 1.5),
    ("general.sampling.min_p", [0.1]), ("general.sampling.top_k", 2.5), ("general.sampling.top_k", True),
])
def test_a_bad_recommendation_is_a_bad_model_file_naming_the_key(key, value):
    with pytest.raises(ModelFileError) as e:
        sampling_defaults.from_gguf(_gguf({key: value}))
    assert key in str(e.value) and "\n" not in str(e.value)


def test_request_values_win_field_by_field():
    e = _engine(RECOMMENDED)
    s = parse_generate({"prompt": "x", "top_p": 0.5, "min_p": 0.1}, engine=e).sampling
    assert (s.temperature, s.top_k, s.top_p, s.min_p) == (0.7, 20, 0.5, 0.1)
    assert parse_generate({"prompt": "x", "temperature": 0}, engine=e).sampling.temperature == 0.0
    assert parse_generate({"prompt": "x"}).sampling.temperature == 0.0  # no engine: reflex's defaults


@pytest.fixture
def fronts(monkeypatch):
    """fronts(meta) -> serve, the JSON lines and the handler, each over a fake engine whose file
    has the metadata `meta`."""
    with fronts_maker(monkeypatch) as make_fronts:

        def make(meta):
            f = make_fronts()
            for front in f.values():
                front.engine.sampling_defaults = sampling_defaults.from_gguf(_gguf(meta))
            return f

        yield make


def _everywhere(f, body: dict) -> dict:
    """The same generation as an OpenAI chat and text completion over HTTP and as a direct op."""
    chat = json.dumps({"messages": [{"role": "user", "content": body["prompt"]}],
                       **{k: v for k, v in body.items() if k != "prompt"}}).encode()
    text = json.dumps(body).encode()
    out = {}
    for name in ("serve", "handler"):
        out[name + "_chat"] = f[name].http("POST", "/v1/chat/completions", chat, AUTH)
        out[name + "_text"] = f[name].http("POST", "/v1/completions", text, AUTH)
    out["lines"] = f["lines"].direct({"op": "generate", **body}, AUTH)
    out["handler_direct"] = f["handler"].direct({"op": "generate", **body}, AUTH)
    return {k: o.body.get("reflex") or o.body.get("record") for k, o in out.items()}


def test_without_recommendations_every_front_end_is_greedy(fronts):
    """The issue's finding: an SDK chat without `temperature` sampled at 1 on serve while the CLI
    was greedy. Now both are greedy: no seed is drawn anywhere."""
    for name, rec in _everywhere(fronts({}), {"prompt": "hi", "max_tokens": 3}).items():
        assert rec["sampling"] == GREEDY and rec["seed"] is None, name


def test_every_front_end_applies_the_files_recommendation(fronts):
    f = fronts(RECOMMENDED)
    want = {"temperature": 0.7, "top_k": 20, "top_p": 0.8, "min_p": 0.0}
    for name, rec in _everywhere(f, {"prompt": "hi", "max_tokens": 3}).items():
        assert rec["sampling"] == want and isinstance(rec["seed"], int), name
    for name, rec in _everywhere(f, {"prompt": "hi", "max_tokens": 3, "temperature": 0, "top_k": 5}).items():
        assert rec["sampling"] == {**want, "temperature": 0.0, "top_k": 5} and rec["seed"] is None, name


def test_models_endpoint_says_which_defaults_apply(fronts):
    f = fronts(RECOMMENDED)
    for name in ("serve", "handler"):
        card = f[name].http("GET", "/v1/models", None, AUTH).body["data"][0]["sampling_defaults"]
        assert card["temperature"] == 0.7 and card["source"]["temperature"] == "model", name
        assert card["min_p"] == 0.0 and card["source"]["min_p"] == "reflex", name
        assert card["not_applied"] == ["general.sampling.penalty_repeat"], name


def _with_recommendation(src, dst, **values) -> str:
    m = GGUFModel.load(src)
    for key, (value, vtype) in values.items():
        m.set(f"general.sampling.{key}", value, vtype)
    dst.write_bytes(m.to_bytes()[0])
    return str(dst)


def _generate(*args):
    r = subprocess.run([sys.executable, "-m", "reflex_runtime.cli", "generate", "Hi", "-n", "3", "--backend", "cpu",
                        "--json", *args], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONUNBUFFERED="1"), stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["record"], r.stderr


def test_the_cli_takes_the_files_recommendation_and_says_so(fixture_paths, tmp_path):
    src = fixture_paths("gemma3", "f32").gguf
    path = _with_recommendation(src, tmp_path / "rec.gguf", temp=(0.6, VT.FLOAT32), top_k=(40, VT.INT32))
    rec, err = _generate("--model", path)
    assert rec["sampling"] == {"temperature": 0.6, "top_k": 40, "top_p": 1.0, "min_p": 0.0}
    assert isinstance(rec["seed"], int)
    notes = [line for line in err.splitlines() if "sampling defaults from the model file" in line]
    assert len(notes) == 1 and "temperature=0.6 top_k=40" in notes[0]
    rec, _ = _generate("--model", path, "--temperature", "0")
    assert rec["sampling"]["temperature"] == 0.0 and rec["seed"] is None
    rec, err = _generate("--model", str(src))  # no recommendation: greedy, and no notice
    assert rec["sampling"] == GREEDY and "sampling defaults" not in err


def test_a_bad_recommendation_fails_the_cli_in_one_line(fixture_paths, tmp_path):
    path = _with_recommendation(fixture_paths("gemma3", "f32").gguf, tmp_path / "bad.gguf", top_p=(7.0, VT.FLOAT32))
    r = subprocess.run([sys.executable, "-m", "reflex_runtime.cli", "generate", "Hi", "--backend", "cpu", "--model", path],
                       capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == ModelFileError.exit_code and r.stdout == ""
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "general.sampling.top_p" in r.stderr
