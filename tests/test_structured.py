"""logprobs, the grammar mask in the reference sampler, and tool-call parsing, on the CPU.

- The reference sampler with a grammar's bitmask: greedy and sampled picks only allowed tokens,
  and the draw follows the allowed tokens' renormalized distribution.
- logprobs through the official openai SDK against `serve` and against the handler (an httpx
  transport into handlers/app.py), on a tiny Qwen3 (the llama.cpp-converted fixture): the chat
  and legacy completions shapes, streamed and not, and values equal to the numpy reference's
  log-softmax of the same positions within 1e-4.
- Tool calls with the fake engine (a scripted `<tool_call>` reply): `tool_calls` and
  finish_reason "tool_calls", the SDK's streamed tool_call deltas accumulate to the same call.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

openai = pytest.importorskip("openai")

from reflex_runtime.api.tools import HermesCalls
from reflex_runtime.reference.sampling import allowed_bits, kept_probabilities, sample, token_logprobs
from reflex_runtime.sampling import SamplingParams

from front_ends import KEY, ServeFront, sdk_clients
from fake_engine import make_engine

# -- the reference sampler under a mask ------------------------------------------------------------


def _words(allow: np.ndarray) -> np.ndarray:
    pad = np.zeros(-len(allow) % 32, dtype=bool)
    return np.packbits(np.concatenate([allow, pad]), bitorder="little").view("<u4")


def test_bitmask_round_trip():
    rng = np.random.default_rng(1)
    allow = rng.random(1000) < 0.3
    assert np.array_equal(allowed_bits(_words(allow), 1000), allow)


@pytest.mark.parametrize("params", [SamplingParams(0.0), SamplingParams(0.7, seed=3), SamplingParams(1.3, top_k=5, seed=4),
                                    SamplingParams(1.0, top_p=0.5, seed=5), SamplingParams(0.9, min_p=0.05, seed=6)],
                         ids=repr)
def test_masked_picks_are_allowed_and_follow_the_allowed_distribution(params):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=997).astype(np.float32) * 3
    allow = rng.random(997) < 0.05
    allow[int(np.argmax(logits))] = False  # the unmasked favourite is forbidden
    picks = [sample(logits, params, step, allow) for step in range(400)]
    assert all(allow[p] for p in picks)
    restricted = np.where(allow, logits, -np.inf).astype(np.float32)
    if params.greedy:
        assert set(picks) == {int(np.argmax(restricted))}
        return
    # Same draws as sampling the restricted row (-inf elsewhere) without a mask: one rule set.
    assert picks == [sample(restricted, params, step) for step in range(400)]
    probs = kept_probabilities(restricted, params)
    assert probs[~allow].sum() == 0
    counts = np.bincount(picks, minlength=997) / len(picks)
    assert abs(counts - probs).max() < 0.1


def test_token_logprobs_are_the_log_softmax_with_ties_to_the_lower_id():
    row = np.array([1.0, 3.0, 3.0, -2.0, 0.5], dtype=np.float32)
    lp, ids, tops = token_logprobs(row, 3, 3)
    ref = row.astype(np.float64) - np.log(np.exp(row.astype(np.float64)).sum())
    assert lp == pytest.approx(ref[3]) and ids == [1, 2, 0]
    assert tops == pytest.approx([ref[1], ref[2], ref[0]])
    assert token_logprobs(row, 0, 0)[1:] == ([], [])


# -- logprobs through the SDK on a real (tiny) model ----------------------------------------------


@pytest.fixture(scope="module")
def tiny(fixture_paths):
    from reflex_runtime.measure.coldstart import Timeline
    from reflex_runtime.loader import load_engine

    return load_engine(str(fixture_paths("qwen3").gguf), backend="cpu", timeline=Timeline())


@pytest.fixture(scope="module")
def clients(tiny):
    """One client per front end, over the same engine."""
    with sdk_clients(tiny, timeout=300) as c:
        yield c


def _reference_rows(engine, prompt_ids, generated):
    """log-softmax of the reference's logits at every generated position (float64)."""
    from reflex_runtime.reference.runner import log_softmax_rows

    model = engine.runner.model
    ids = list(prompt_ids) + list(generated[:-1])
    logits = model.forward(ids, model.new_cache(len(ids)))[len(prompt_ids) - 1:]
    return log_softmax_rows(logits)


def _ids_of(engine, entries) -> list[int]:
    by_bytes = {engine.tokenizer.token_bytes(i): i for i in range(engine.tokenizer.vocab_size)}
    return [by_bytes[bytes(e["bytes"])] for e in entries]


def _check_chat_entries(engine, prompt_ids, entries, k):
    ids = _ids_of(engine, entries)
    rows = _reference_rows(engine, prompt_ids, ids)
    for j, (e, tok) in enumerate(zip(entries, ids)):
        assert e["token"] == engine.tokenizer.token_bytes(tok).decode("utf-8", "backslashreplace")
        assert abs(e["logprob"] - rows[j, tok]) < 1e-4
        assert len(e["top_logprobs"]) == k
        want = np.argsort(-rows[j], kind="stable")[:k]
        assert _ids_of(engine, e["top_logprobs"]) == [int(i) for i in want]
        assert np.allclose([t["logprob"] for t in e["top_logprobs"]], rows[j, want], atol=1e-4)
    return ids


MESSAGES = [{"role": "user", "content": "Count to three."}]


@pytest.mark.parametrize("front", ["serve", "handler"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_chat_logprobs_match_the_reference(tiny, clients, front, stream):
    client = clients[front]
    args = dict(model="m", messages=MESSAGES, max_tokens=5, temperature=0.9, seed=11, logprobs=True, top_logprobs=3)
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **args))
        entries = [e.model_dump() for c in chunks if c.choices and c.choices[0].logprobs
                   for e in c.choices[0].logprobs.content]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        out = client.chat.completions.create(**args)
        entries = [e.model_dump() for e in out.choices[0].logprobs.content]
        text = out.choices[0].message.content
        assert out.choices[0].logprobs.refusal is None
    assert len(entries) == 5  # max_tokens, no stop token in 5 draws from a random model
    ids = _check_chat_entries(tiny, tiny.prompt_ids(messages=MESSAGES), entries, 3)
    assert tiny.tokenizer.decode(ids) == text


@pytest.mark.parametrize("front", ["serve", "handler"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_completion_logprobs_legacy_shape_match_the_reference(tiny, clients, front, stream):
    client = clients[front]
    prompt = [9707, 11, 1879, 0, 576]  # token ids: the prompt is exactly these
    args = dict(model="m", prompt=prompt, max_tokens=4, temperature=0, logprobs=2)
    if stream:
        chunks = list(client.completions.create(stream=True, **args))
        parts = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
        tokens = [t for p in parts for t in p.tokens]
        lps = [x for p in parts for x in p.token_logprobs]
        tops = [x for p in parts for x in p.top_logprobs]
        offsets = [x for p in parts for x in p.text_offset]
        text = "".join(c.choices[0].text for c in chunks if c.choices)
    else:
        out = client.completions.create(**args)
        lp = out.choices[0].logprobs
        tokens, lps, tops, offsets, text = lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset, out.choices[0].text
    assert len(tokens) == len(lps) == len(tops) == len(offsets) == 4
    assert "".join(tokens) == text and offsets == [sum(len(t) for t in tokens[:j]) for j in range(4)]
    by_text = {tiny.tokenizer.token_bytes(i).decode("utf-8", "backslashreplace"): i
               for i in range(tiny.tokenizer.vocab_size)}
    ids = [by_text[t] for t in tokens]
    rows = _reference_rows(tiny, prompt, ids)
    for j, tok in enumerate(ids):
        assert tok == int(np.argmax(rows[j]))  # greedy
        assert abs(lps[j] - rows[j, tok]) < 1e-4
        assert len(tops[j]) == 2 and all(abs(v - rows[j, by_text[t]]) < 1e-4 for t, v in tops[j].items())


def test_direct_generate_logprobs_carry_token_ids(tiny):
    from reflex_runtime.api.direct_ops import parse_generate, run_generate

    prompt_ids = tiny.prompt_ids("Hello")
    res = run_generate(tiny, parse_generate({"prompt": "Hello", "max_tokens": 3, "logprobs": 1}, tiny.limits))
    ids = [e["token_id"] for e in res["logprobs"]]
    rows = _reference_rows(tiny, prompt_ids, ids)
    for j, e in enumerate(res["logprobs"]):
        assert abs(e["logprob"] - rows[j, e["token_id"]]) < 1e-4
        assert e["top_logprobs"][0]["token_id"] == int(np.argmax(rows[j])) == e["token_id"]


# -- tool calls (the fake engine answers with a scripted call) ------------------------------------

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}]
CALL_REPLY = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture
def tool_fake():
    engine = make_engine(reply=CALL_REPLY)
    engine.tools_format = "hermes"
    front = ServeFront(engine=engine)
    yield openai.OpenAI(base_url=f"http://127.0.0.1:{front.port}/v1", api_key=KEY, max_retries=0)
    front.close()


def test_tool_calls_whole_and_streamed(tool_fake):
    args = dict(model="m", messages=[{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS, max_tokens=200)
    out = tool_fake.chat.completions.create(**args)
    c = out.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content == "Let me check."
    (call,) = c.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    chunks = list(tool_fake.chat.completions.create(stream=True, **args))
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    deltas = [d for ch in chunks if ch.choices for d in (ch.choices[0].delta.tool_calls or [])]
    assert content == "Let me check." and len(deltas) == 1
    d = deltas[0]
    assert d.index == 0 and d.function.name == "get_weather" and json.loads(d.function.arguments) == {"city": "Paris"}
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"


def test_tool_choice_none_renders_no_tools_and_parses_nothing(tool_fake):
    out = tool_fake.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], tools=TOOLS,
                                            tool_choice="none", max_tokens=200)
    assert out.choices[0].message.tool_calls is None and out.choices[0].message.content == CALL_REPLY
    assert out.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("text, content, names", [
    ("plain", "plain", []),
    ('<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b", "arguments": {"x": 1}}</tool_call>',
     None, ["a", "b"]),
    ("x <tool_call>not json</tool_call>", "x <tool_call>not json</tool_call>", []),
    ('<tool_call>{"name": "a", "arguments": {}}', None, ["a"]),  # cut by max_tokens after a whole object
])
def test_hermes_parse(text, content, names):
    got_content, calls = HermesCalls.parse(text)
    assert got_content == content and [c["function"]["name"] for c in calls] == names
    p, streamed = HermesCalls(), []
    for ch in text:  # one character at a time: the same split
        streamed += p.feed(ch)
    streamed += p.end()
    assert [v[1]["function"]["name"] for k, v in streamed if k == "call"] == names
