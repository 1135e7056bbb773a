"""api/direct_ops.py: the direct request shapes (JSON lines, Lambda direct invokes)."""

from __future__ import annotations

import pytest

from reflex_runtime.api.direct_ops import parse_generate, parse_system1, run_generate
from reflex_runtime.api.fields import check_messages
from reflex_runtime.engine import GenerateRequest
from reflex_runtime.errors import RequestError

from fake_engine import engine, make_engine  # noqa: F401 (engine is a fixture)


# -- parse_generate -----------------------------------------------------------------------------


def test_parse_generate_full():
    req = parse_generate({"op": "generate", "id": 7, "stream": True, "prompt": "hi", "max_tokens": 5,
                          "temperature": 0.7, "top_k": 40, "top_p": 0.9, "min_p": 0.05, "seed": 3,
                          "stop": "\n", "chat": True, "enable_thinking": False, "ignore_eos": True})
    assert isinstance(req, GenerateRequest)
    assert (req.prompt, req.messages, req.max_tokens, req.stop, req.chat) == ("hi", None, 5, ("\n",), True)
    s = req.sampling
    assert (s.temperature, s.top_k, s.top_p, s.min_p, s.seed) == (0.7, 40, 0.9, 0.05, 3)
    assert req.enable_thinking is False and req.ignore_eos is True


def test_parse_generate_defaults_are_greedy():
    req = parse_generate({"prompt": "hi"})
    assert req.max_tokens == 64 and req.sampling.temperature == 0.0 and req.stop == () and not req.chat


@pytest.mark.parametrize("patch, field", [
    ({"prompt": 5}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "user", "content": "a"}]}, "messages"),  # both prompt and messages
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 2.5}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"min_p": 2}, "min_p"),
    ({"seed": -3}, "seed"),
    ({"stop": ""}, "stop"),
    ({"stop": ["a"] * 9}, "stop"),
    ({"stop": [1]}, "stop"),
    ({"chat": "yes"}, "chat"),
    ({"frobnicate": 1}, "frobnicate"),
])
def test_parse_generate_names_the_bad_field(patch, field):
    with pytest.raises(RequestError) as ei:
        parse_generate({"prompt": "hi", **patch})
    assert ei.value.field == field
    assert "\n" not in str(ei.value)


def test_parse_generate_rejects_non_object():
    with pytest.raises(RequestError):
        parse_generate(["prompt", "hi"])


# -- messages -------------------------------------------------------------------------------------


def test_check_messages_normalizes():
    out = check_messages([
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "name": "x"},
        {"role": "assistant", "content": "ok", "tool_calls": None, "refusal": None},
    ])
    assert out == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a\nb"},
                   {"role": "assistant", "content": "ok"}]


@pytest.mark.parametrize("msgs, field", [
    ("hi", "messages"),
    ([], "messages"),
    (["hi"], "messages[0]"),
    ([{"role": "wizard", "content": "x"}], "messages[0].role"),
    ([{"content": "x"}], "messages[0].role"),
    ([{"role": "user"}], "messages[0].content"),
    ([{"role": "user", "content": 3}], "messages[0].content"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "messages[0].content"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "tool_calls": [{}]}],
     "messages[1].tool_calls[0]"),
])
def test_check_messages_errors(msgs, field):
    with pytest.raises(RequestError) as ei:
        check_messages(msgs)
    assert ei.value.field == field


# -- system1 --------------------------------------------------------------------------------------


def test_parse_system1():
    assert parse_system1({"op": "system1", "prompt": "p", "candidates": ["a", "b"]}) == ("p", ["a", "b"], None, False)
    p, c, m, chat = parse_system1({"messages": [{"role": "user", "content": "q"}], "candidates": ["x"], "chat": True})
    assert p is None and m == [{"role": "user", "content": "q"}] and chat is True


@pytest.mark.parametrize("patch, field", [
    ({"candidates": []}, "candidates"),
    ({"candidates": "a"}, "candidates"),
    ({"candidates": ["a", ""]}, "candidates"),
    ({"candidates": ["a", 3]}, "candidates"),
    ({"prompt": None}, "prompt"),
    ({"max_tokens": 3}, "max_tokens"),
])
def test_parse_system1_errors(patch, field):
    with pytest.raises(RequestError) as ei:
        parse_system1({"prompt": "p", "candidates": ["a"], **patch})
    assert ei.value.field == field


# -- against the engine ------------------------------------------------------------------------------


def test_run_generate_with_stop_and_length(engine):
    res = run_generate(engine, parse_generate({"prompt": "hi", "stop": ["quick"]}))
    assert res["text"] == "Hello world! The " and res["finish_reason"] == "stop"
    res = run_generate(engine, parse_generate({"prompt": "hi", "max_tokens": 5}))
    assert res["text"] == "Hello" and res["finish_reason"] == "length"
    assert res["record"]["generated_tokens"] == 5 and res["record"]["prompt_tokens"] == 3


def test_engine_limits_surface_as_request_errors(engine):
    with pytest.raises(RequestError) as ei:
        run_generate(engine, parse_generate({"prompt": "hi", "max_tokens": 10_000}))
    assert ei.value.field == "max_tokens"


def test_chat_records_say_which_template_laid_out_the_messages(engine):
    """A file without a chat template (a base model) still answers chat requests, laid out in the
    plain fallback format, and the record says so; prompt requests carry no chat fields."""
    assert "no chat template" in engine.chat_notice and "ChatML" in engine.chat_notice
    res = run_generate(engine, parse_generate({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}))
    assert res["record"]["chat_template"] == "none (plain ChatML fallback)"
    assert res["record"]["notice"] == engine.chat_notice
    res = run_generate(engine, parse_generate({"prompt": "hi", "chat": True, "max_tokens": 3}))
    assert res["record"]["notice"] == engine.chat_notice
    plain = run_generate(engine, parse_generate({"prompt": "hi", "max_tokens": 3}))["record"]
    assert "notice" not in plain and "chat_template" not in plain
    scored = engine.system1(prompt="hi", candidates=["Hello", "Bye"], chat=True)["record"]
    assert scored["notice"] == engine.chat_notice

    templated = make_engine()
    templated._chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert templated.chat_notice is None
    rec = run_generate(templated, parse_generate({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}))["record"]
    assert rec["chat_template"] == "model" and "notice" not in rec
