"""Chat prompts: a GGUF's `tokenizer.chat_template` rendered the way transformers'
`apply_chat_template(tokenize=False)` renders it, or a plain fallback when the file has none.

Rendering matches transformers: jinja2's ImmutableSandboxedEnvironment with trim_blocks and
lstrip_blocks, the loopcontrols extension, a `{% generation %}` block that just renders its body,
a `tojson` filter that does not escape HTML, `raise_exception`, `strftime_now`, namespaces that
refuse underscore names; messages lose their None-valued keys and get `reasoning_content` filled
from `thinking`/`reasoning`. Variables: messages, tools, documents (None), add_generation_prompt,
bos_token, eos_token, and enable_thinking only when it is not None.

The fallbacks need no jinja2: Gemma's turn format for Gemma files (as Gemma 3's own template
renders it) and ChatML for everything else.

BOS: templates that print `bos_token` (Gemma's does) put it in the text. Then either pass the
BOS text here and encode with add_special=False, or pass bos_token="" and let encode add it.

jinja2 takes tens of milliseconds to import (26 ms on the dev VM), so it is imported on the first
templated render, and compiled templates are kept for the life of the process.
"""

from __future__ import annotations

from typing import Any, Sequence

from .errors import RequestError

GEMMA_ARCHITECTURES = frozenset({"gemma", "gemma2", "gemma3", "gemma3n"})
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")

_environment = None
_compiled: dict[str, Any] = {}


def fallback_name(architecture: str | None) -> str:
    """What render_chat(None, ...) lays messages out in for this architecture."""
    return "Gemma turn" if architecture in GEMMA_ARCHITECTURES else "ChatML"


def render_chat(template: str | None, messages: Sequence[dict], add_generation_prompt: bool = True,
                enable_thinking: bool | None = None, tools: list[dict] | None = None, bos_token: str = "",
                eos_token: str = "", *, architecture: str | None = None) -> str:
    """Messages -> prompt text. template=None uses the plain fallback for `architecture`."""
    messages = _normalized(messages)
    if tools is not None and (not isinstance(tools, (list, tuple)) or not all(isinstance(t, dict) for t in tools)):
        raise RequestError("tools must be a list of JSON objects", field="tools")
    if template is None:
        if tools:
            raise RequestError("this model file has no chat template, so tools cannot be described to it",
                               field="tools")
        if architecture in GEMMA_ARCHITECTURES:
            return _gemma_prompt(messages, add_generation_prompt, bos_token)
        return _chatml_prompt(messages, add_generation_prompt)

    compiled = _compile(template)
    variables = {
        "messages": messages,
        "tools": tools,
        "documents": None,
        "add_generation_prompt": add_generation_prompt,
        "bos_token": bos_token,
        "eos_token": eos_token,
    }
    if enable_thinking is not None:
        variables["enable_thinking"] = enable_thinking
    try:
        return compiled.render(**variables)
    except Exception as e:  # the template's own raise_exception, undefined fields, bad types, ...
        raise RequestError(f"chat template failed: {_describe(e)}", field="messages") from None


# -- messages ---------------------------------------------------------------------------------


def _normalized(messages: Any) -> list[dict]:
    """A fresh list of message dicts without None-valued keys (templates test for missing keys,
    and OpenAI clients send content=None), with reasoning under the names templates read."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise RequestError("messages must be a non-empty list", field="messages")
    out = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError("each message must be an object with a string 'role'", field="messages")
        message = {key: value for key, value in message.items() if value is not None}
        reasoning = next((message[k] for k in _REASONING_KEYS if k in message), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def _text_parts(content: Any) -> list[str]:
    """A message's text: a string, or the texts of a list of {"type": "text", "text": ...} parts."""
    if content is None:
        return [""]
    if isinstance(content, str):
        return [content]
    if isinstance(content, (list, tuple)):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError("this model takes text content only", field="messages")
            texts.append(part["text"])
        return texts
    raise RequestError("message content must be a string or a list of text parts", field="messages")


# -- fallbacks --------------------------------------------------------------------------------


def _chatml_prompt(messages: list[dict], add_generation_prompt: bool) -> str:
    turns = [
        f"<|im_start|>{m['role']}\n{''.join(_text_parts(m.get('content')))}<|im_end|>\n" for m in messages
    ]
    if add_generation_prompt:
        turns.append("<|im_start|>assistant\n")
    return "".join(turns)


def _gemma_prompt(messages: list[dict], add_generation_prompt: bool, bos_token: str) -> str:
    """Gemma 3's template: no system turn (its text and a blank line open the first turn), roles
    user/model strictly alternating, each part of a message trimmed."""
    prefix = ""
    if messages[0]["role"] == "system":
        prefix = _text_parts(messages[0].get("content"))[0] + "\n\n"
        messages = messages[1:]
    out = [bos_token]
    for index, message in enumerate(messages):
        if (message["role"] == "user") != (index % 2 == 0):
            raise RequestError("Gemma conversations must alternate user and assistant turns, starting with user",
                               field="messages")
        role = "model" if message["role"] == "assistant" else message["role"]
        text = "".join(part.strip() for part in _text_parts(message.get("content")))
        out.append(f"<start_of_turn>{role}\n{prefix if index == 0 else ''}{text}<end_of_turn>\n")
    if add_generation_prompt:
        out.append("<start_of_turn>model\n")
    return "".join(out)


# -- jinja2 -----------------------------------------------------------------------------------


def _compile(template: str):
    compiled = _compiled.get(template)
    if compiled is None:
        if not isinstance(template, str):
            raise RequestError("chat template must be a string")
        try:
            compiled = _jinja_environment().from_string(template)
        except Exception as e:
            raise RequestError(f"chat template does not compile: {_describe(e)}") from None
        _compiled[template] = compiled
    return compiled


def _jinja_environment():
    global _environment
    if _environment is None:
        _environment = _build_environment()
    return _environment


def _build_environment():
    import json
    from datetime import datetime

    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}` marks the assistant's text for training masks;
        rendering only needs the body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class Namespace(jinja2.utils.Namespace):
        """namespace() that refuses underscore attribute names, which could reach interpreter internals."""

        def __init__(*args, **kwargs):
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for name in attrs:
                Namespace._refuse_private(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            Namespace._refuse_private(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _refuse_private(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} starts with an underscore")

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # jinja2's own tojson escapes <, >, & and ' for HTML; chat templates want plain JSON.
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    class DictMaker:
        """dict() and dict.fromkeys() for templates, without handing them the dict type itself."""

        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, namespace=Namespace,
                       dict=DictMaker())
    return env


def _describe(error: Exception) -> str:
    text = " ".join(str(error).split())
    return text if text else type(error).__name__
