"""api/openai_mapping.py against the fake engine (tests/fake_engine.py): shapes, streaming, validation."""

from __future__ import annotations

import json

import pytest

from reflex_runtime.api import openai_mapping as api
from reflex_runtime.api.json_wire import parse_object
from reflex_runtime.api.responses import error_response, sse_lines
from reflex_runtime.errors import ModelFileError, RequestError

from fake_engine import REPLY, make_engine

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture
def engine():
    return make_engine()


def _chat(engine, **body):
    return api.chat_completions(engine, {"model": "x", "messages": USER, "temperature": 0, **body})


def _events(resp):
    """Parse sse_lines() output back into objects, checking the framing."""
    out = []
    for line in sse_lines(resp.stream):
        assert line.startswith(b"data: ") and line.endswith(b"\n\n")
        out.append(line[6:-2].decode())
    assert out[-1] == "[DONE]"
    return [json.loads(x) for x in out[:-1]]


def test_chat_completion_shape(engine):
    r = _chat(engine, max_tokens=5)
    b = r.body
    assert r.status == 200 and r.stream is None
    assert b["id"].startswith("chatcmpl-") and b["object"] == "chat.completion"
    assert isinstance(b["created"], int) and b["model"] == "fake-model"
    (c,) = b["choices"]
    assert c == {"index": 0, "finish_reason": "length", "logprobs": None,
                 "message": {"role": "assistant", "content": "Hello"}}
    assert b["usage"] == {"prompt_tokens": b["reflex"]["prompt_tokens"], "completion_tokens": 5,
                          "total_tokens": b["reflex"]["prompt_tokens"] + 5}
    assert b["reflex"]["op"] == "generate" and b["reflex"]["backend"] == "fake"


def test_chat_runs_to_eos_without_max_tokens(engine):
    b = _chat(engine).body
    assert b["choices"][0]["message"]["content"] == REPLY
    assert b["choices"][0]["finish_reason"] == "stop"


def test_chat_uses_the_template(engine):
    # The fake template renders "<user>hi\n<assistant>" after BOS: 1 + 16 bytes.
    assert _chat(engine, max_tokens=1).body["usage"]["prompt_tokens"] == 1 + len("<user>hi\n<assistant>")


def test_chat_stream_chunks(engine):
    r = _chat(engine, stream=True, stream_options={"include_usage": True}, max_tokens=40)
    assert r.status == 200 and r.body is None
    ev = _events(r)
    assert all(e["object"] == "chat.completion.chunk" and e["id"] == ev[0]["id"] for e in ev)
    assert ev[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in ev if e["choices"])
    assert text == REPLY
    final, usage = ev[-2], ev[-1]
    assert final["choices"][0]["finish_reason"] == "stop" and final["choices"][0]["delta"] == {}
    assert final["reflex"]["generated_tokens"] == len(REPLY) + 1  # the EOS was generated too
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(REPLY) + 1
    assert all(e["usage"] is None for e in ev[:-1])


def test_chat_stream_without_usage_has_no_usage_key(engine):
    ev = _events(_chat(engine, stream=True, max_tokens=3))
    assert all("usage" not in e for e in ev)
    assert ev[-1]["choices"][0]["finish_reason"] == "length"


def test_stop_string_and_list(engine):
    b = _chat(engine, stop="world").body
    assert b["choices"][0]["message"]["content"] == "Hello " and b["choices"][0]["finish_reason"] == "stop"
    b = _chat(engine, stop=["fox", "quick"]).body
    assert b["choices"][0]["message"]["content"] == "Hello world! The "


def test_completions(engine):
    b = api.completions(engine, {"model": "m", "prompt": "abc", "max_tokens": 5, "temperature": 0}).body
    assert b["id"].startswith("cmpl-") and b["object"] == "text_completion"
    assert b["choices"] == [{"index": 0, "text": "Hello", "finish_reason": "length", "logprobs": None}]
    assert b["usage"]["prompt_tokens"] == 4  # BOS + 3 bytes: no chat template


def test_completions_default_max_tokens_is_16(engine):
    b = api.completions(engine, {"prompt": "abc", "temperature": 0}).body
    assert b["usage"]["completion_tokens"] == 16


def test_completions_token_ids_and_single_item_lists(engine):
    b = api.completions(engine, {"prompt": [1, 80, 81], "max_tokens": 2}).body
    assert b["usage"]["prompt_tokens"] == 3
    b = api.completions(engine, {"prompt": ["abc"], "max_tokens": 2}).body
    assert b["usage"]["prompt_tokens"] == 4


def test_completions_stream(engine):
    ev = _events(api.completions(engine, {"prompt": "abc", "max_tokens": 5, "stream": True}))
    assert all(e["object"] == "text_completion" for e in ev)
    assert "".join(e["choices"][0]["text"] for e in ev) == "Hello"
    assert ev[-1]["choices"][0]["finish_reason"] == "length" and "reflex" in ev[-1]


@pytest.mark.parametrize("patch, param", [
    ({"n": 2}, "n"),
    ({"n": True}, "n"),
    ({"logprobs": 1}, "logprobs"),
    ({"top_logprobs": 3}, "top_logprobs"),  # without logprobs: true
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}, "response_format.json_schema.name"),
    ({"response_format": "json"}, "response_format"),
    ({"tool_choice": "required"}, "tool_choice"),  # without tools
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"temperature": 3}, "temperature"),
    ({"temperature": "0.5"}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 100_000}, "max_tokens"),
    ({"max_tokens": 5, "max_completion_tokens": 6}, "max_completion_tokens"),
    ({"stop": ["a"] * 9}, "stop"),
    ({"stream": "yes"}, "stream"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"tools": [{"type": "function"}]}, "tools"),
    ({"model": 3}, "model"),
    ({"seed": "1"}, "seed"),
    ({"bogus": 1}, "bogus"),
])
def test_chat_validation_names_the_param(engine, patch, param):
    with pytest.raises(RequestError) as ei:
        _chat(engine, **patch)
    assert ei.value.field == param
    r = error_response(ei.value)
    assert r.status == 400 and r.body["error"]["param"] == param
    assert r.body["error"]["type"] == "invalid_request_error"


def test_tools_on_a_template_without_tool_support_name_the_field(engine):
    with pytest.raises(RequestError, match="does not describe tools") as ei:
        _chat(engine, tools=[{"type": "function", "function": {"name": "f"}}])
    assert ei.value.field == "tools"


def test_neutral_values_are_accepted(engine):
    r = _chat(engine, max_tokens=2, n=1, logprobs=False, presence_penalty=0, frequency_penalty=0.0,
              logit_bias={}, user="u", response_format={"type": "text"}, tools=[], seed=5,
              chat_template_kwargs={"enable_thinking": False})
    assert r.status == 200


def test_completion_validation(engine):
    for body, param in [({"prompt": ["a", "b"]}, "prompt"), ({"prompt": [1, 99999]}, "prompt"),
                        ({"prompt": 5}, "prompt"), ({}, "prompt"), ({"prompt": "a", "echo": True}, "echo"),
                        ({"prompt": "a", "best_of": 2}, "best_of"), ({"prompt": "a", "messages": USER}, "messages")]:
        with pytest.raises(RequestError) as ei:
            api.completions(engine, body)
        assert ei.value.field == param, body


def test_prompt_beyond_context_is_400_before_streaming():
    small = make_engine(max_context=16)
    with pytest.raises(RequestError) as ei:
        api.completions(small, {"prompt": "x" * 20, "stream": True, "max_tokens": 2})
    assert ei.value.field == "max_tokens"


def test_closing_a_stream_closes_the_generation(engine):
    r = _chat(engine, stream=True, max_tokens=40)
    lines = sse_lines(r.stream)
    next(lines), next(lines), next(lines)
    lines.close()
    runner = engine.runner
    assert runner.closed == runner.started == 1 and runner.tokens < 10


def test_closing_an_unstarted_stream_frees_the_engine(engine):
    r = _chat(engine, stream=True, max_tokens=40)  # prefill ran: the generation is open
    r.stream.close()
    assert engine.runner.closed == 1
    _chat(engine, max_tokens=2)  # the runner's busy lock is free again


def test_error_mid_stream_becomes_an_error_event():
    def chunks():
        yield {"a": 1}
        raise RequestError("boom", field="x")

    out = list(sse_lines(chunks()))
    assert out[0] == b'data: {"a":1}\n\n'
    assert json.loads(out[1][6:])["error"]["message"] == "boom" and len(out) == 2


def test_error_response_kinds():
    r = error_response(ModelFileError("bad file"))
    assert r.status == 503 and r.body["error"]["type"] == "model_file_error"
    r = error_response(ValueError("oops\nsecond line"))
    assert r.status == 500 and r.body["error"]["message"] == "internal error: ValueError: oops second line"


@pytest.mark.parametrize("raw", [b"", b"{", b"[1]", b'"x"', b'{"a": NaN}', b"\xff\xfe"])
def test_parse_json_body_rejects(raw):
    with pytest.raises(RequestError):
        parse_object(raw)


def test_parse_json_body_ok():
    assert parse_object('{"a": "é"}'.encode()) == {"a": "é"}


def test_models(engine):
    b = api.models(engine).body
    assert b["object"] == "list" and b["data"][0]["id"] == "fake-model" and b["data"][0]["object"] == "model"


def test_system1(engine):
    b = api.system1(engine, {"model": "m", "prompt": "q", "candidates": ["Hello", "Bye"]}).body
    assert b["object"] == "system1.result" and b["best_index"] == 0 and b["best_text"] == "Hello"
    assert b["candidates"][1]["score"] < b["candidates"][0]["score"]
    with pytest.raises(RequestError) as ei:
        api.system1(engine, {"prompt": "q", "candidates": []})
    assert ei.value.field == "candidates"
