"""Structured output and tool calls on a real instruct model: SmolLM2-135M-Instruct Q4_1 (the
`smollm2` short name) on the CPU backend, through the official openai SDK against `serve` and
against the handler (an httpx transport into handlers/app.py), and the JSON-lines transport.

- 50 seeded `json_schema` completions (sampled at temperature 1) all parse and validate
  (`jsonschema`); a short schema keeps each at ~10-15 tokens.
- `json_object` through the direct op (stdio/uds), stream and not.
- A tool-call round trip (call, tool result, final answer): SmolLM2-135M's own chat template
  never reads `tools`, so tools on it are a 400 naming "tools"; the round trip runs on the same
  weights with a Hermes-style tool template written into a copy of the file (TOOL_TEMPLATE).
- Bad input: an invalid schema, an unsupported response_format, tools on a template without tool
  support -> 400 naming the field, on both front ends.
"""

from __future__ import annotations

import json
import time

import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

from front_ends import KEY, LinesFront, ServeFront, sdk_clients
from reflex_runtime.loader import load_engine  # before HandlerFront patches loader.load_engine


pytestmark = pytest.mark.slow

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "pet"],
          "properties": {"name": {"type": "string", "maxLength": 10},
                         "age": {"type": "integer", "minimum": 1, "maximum": 99},
                         "pet": {"enum": ["cat", "dog", "none"]}}}
ASK = [{"role": "user", "content": "Invent a person. Answer in JSON."}]
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"], "additionalProperties": False}}}]

# A Hermes-style tool template (ChatML, which SmolLM2 was tuned on), written for these tests: the
# tools in the system turn, calls as <tool_call>{json}</tool_call>, results in <tool_response>.
TOOL_TEMPLATE = (
    "{%- set sys = messages[0].content if messages[0].role == 'system' else '' -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' + (sys + '\\n\\n' if sys else '') + 'You can call these functions:\\n<tools>\\n' -}}"
    "{%- for t in tools -%}{{- t | tojson + '\\n' -}}{%- endfor -%}"
    "{{- '</tools>\\nTo call one, answer with <tool_call>\\n{\"name\": <name>, \"arguments\": <object>}\\n"
    "</tool_call><|im_end|>\\n' -}}"
    "{%- elif sys -%}{{- '<|im_start|>system\\n' + sys + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' -%}"
    "{%- elif m.role == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- elif m.role == 'assistant' and m.tool_calls -%}"
    "{{- '<|im_start|>assistant\\n' + (m.content + '\\n' if m.content else '') -}}"
    "{%- for c in m.tool_calls -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + c.function.name + '\", \"arguments\": ' + c.function.arguments | tojson"
    " + '}\\n</tool_call>' -}}"
    "{%- endfor -%}{{- '<|im_end|>\\n' -}}"
    "{%- else -%}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def _engine(path):
    from reflex_runtime.measure.coldstart import Timeline

    return load_engine(str(path), backend="cpu", timeline=Timeline())


@pytest.fixture(scope="module")
def smol(smollm2_path):
    return _engine(smollm2_path)


@pytest.fixture(scope="module")
def smol_tools(smollm2_path, tmp_path_factory):
    """SmolLM2's weights and tokenizer with TOOL_TEMPLATE as the file's chat template."""
    from gguf_edit import VT, GGUFModel

    path = tmp_path_factory.mktemp("tools") / "smollm2-tools.gguf"
    model = GGUFModel.load(str(smollm2_path))
    model.set("tokenizer.chat_template", TOOL_TEMPLATE, VT.STRING)
    path.write_bytes(model.to_bytes()[0])
    return _engine(path)


@pytest.fixture(scope="module")
def fronts(smol):
    with sdk_clients(smol) as c:
        yield c


def _schema_format(schema=PERSON):
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}


def test_50_seeded_json_schema_completions_parse_and_validate(fronts):
    t0, tokens, seen = time.monotonic(), 0, set()
    for seed in range(50):
        front = "serve" if seed < 35 else "handler"
        args = dict(model="m", messages=ASK, max_tokens=40, temperature=1.0, seed=seed,
                    response_format=_schema_format())
        if seed % 5 == 4:  # some streamed
            chunks = list(fronts[front].chat.completions.create(stream=True, **args))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        else:
            out = fronts[front].chat.completions.create(**args)
            text, finish = out.choices[0].message.content, out.choices[0].finish_reason
            tokens += out.usage.completion_tokens
        obj = json.loads(text)
        jsonschema.validate(obj, PERSON)
        assert finish == "stop", (seed, text)
        seen.add(text)
    assert len(seen) > 10  # sampled, not one forced string
    print(f"\n50 json_schema completions in {time.monotonic() - t0:.1f} s ({tokens} tokens in the non-streamed 40)")


def test_json_object_over_json_lines(smol):
    lines = LinesFront(engine=smol, api_key=None)
    req = {"op": "generate", "id": 1, "messages": ASK, "max_tokens": 48, "temperature": 0.8, "seed": 3,
           "response_format": {"type": "json_object"}, "logprobs": 0}
    for stream in (False, True):
        out = lines.lines(json.dumps({**req, "stream": stream}).encode())
        res = out[-1]
        if res["finish_reason"] == "stop":
            assert isinstance(json.loads(res["text"]), dict)
        else:  # cut by max_tokens: still a prefix of an object
            assert res["text"].startswith("{")
        assert res["record"]["constrained"] == "json_object" and len(res["logprobs"]) >= 1
        if stream:
            assert "".join(o["delta"] for o in out[:-1]) == res["text"]


def test_tool_call_round_trip(smol_tools):
    """call (forced by tool_choice "required"), the tool's result, the final answer; the same call
    streamed comes out as tool_call deltas."""
    serve = ServeFront(engine=smol_tools)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{serve.port}/v1", api_key=KEY, max_retries=0, timeout=600)
        messages = [{"role": "user", "content": "What is the weather in Paris right now?"}]
        first = client.chat.completions.create(model="m", messages=messages, tools=WEATHER, tool_choice="required",
                                               max_tokens=40, temperature=0)
        c = first.choices[0]
        assert c.finish_reason == "tool_calls" and c.message.tool_calls, c
        call = c.message.tool_calls[0]
        args = json.loads(call.function.arguments)
        assert call.function.name == "get_weather"
        jsonschema.validate(args, WEATHER[0]["function"]["parameters"])

        chunks = list(client.chat.completions.create(model="m", messages=messages, tools=WEATHER,
                                                     tool_choice="required", max_tokens=40, temperature=0, stream=True))
        deltas = [d for ch in chunks if ch.choices for d in (ch.choices[0].delta.tool_calls or [])]
        assert [(d.index, d.function.name, d.function.arguments) for d in deltas][:1] == \
            [(0, "get_weather", call.function.arguments)]

        messages += [c.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"}]
        final = client.chat.completions.create(model="m", messages=messages, tools=WEATHER, max_tokens=24,
                                               temperature=0)
        f = final.choices[0]
        assert f.finish_reason in ("stop", "length") and not f.message.tool_calls
        assert isinstance(f.message.content, str) and f.message.content.strip()
        # the tool's result reached the prompt through the template
        assert final.usage.prompt_tokens > first.usage.prompt_tokens + 10
    finally:
        serve.close()


@pytest.mark.parametrize("front", ["serve", "handler"])
@pytest.mark.parametrize("extra, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "thing"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}}}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "grammar", "grammar": "root ::= x"}}, "response_format.type"),
    ({"tools": WEATHER}, "tools"),  # SmolLM2-135M's template has no tool support
])
def test_bad_input_is_400_naming_the_field(fronts, front, extra, param):
    with pytest.raises(openai.BadRequestError) as ei:
        fronts[front].chat.completions.create(model="m", messages=ASK, max_tokens=4, **extra)
    err = ei.value.body
    assert ei.value.status_code == 400 and err["param"] == param and err["type"] == "invalid_request_error", err
