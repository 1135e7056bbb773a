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

Budget: a template comes from the model file, so a hostile one must not hang or balloon a render.
Every loop iteration and every call a template makes is a step; a render gets MAX_STEPS steps
and MAX_SECONDS of wall time, else it fails with one line (RequestError). Operators that could
build a huge value in one step are checked first: `*` and `+` on strings and lists, `~`
concatenation, `**` on integers, `%` formatting and string methods with a width (ljust, center,
zfill...) may not make more than MAX_TEXT characters (digits). Templates over MAX_TEMPLATE
characters are refused. Real templates (Qwen3, Gemma 3, Llama 3, ChatML) use a few hundred steps
per message and render exactly as before.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any, Sequence

from ..errors import RequestError

GEMMA_ARCHITECTURES = frozenset({"gemma", "gemma2", "gemma3", "gemma3n"})
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")

MAX_STEPS = 1_000_000  # loop iterations + calls per render
MAX_SECONDS = 2.0  # wall time per render
MAX_TEXT = 1 << 24  # characters (or digits) one operator or method may produce
MAX_TEMPLATE = 1 << 20  # characters of template source [real templates: < 100 KB]

_environment = None
_compiled: dict[str, Any] = {}
_budget = threading.local()  # .steps (left), .deadline: set per render by render_chat


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
    _budget.steps, _budget.deadline = MAX_STEPS, time.monotonic() + MAX_SECONDS
    try:
        return compiled.render(**variables)
    except RecursionError:
        raise RequestError("chat template failed: it recursed too deeply", field="messages") from None
    except Exception as e:  # the template's own raise_exception, undefined fields, bad types, budget...
        raise RequestError(f"chat template failed: {_describe(e)}", field="messages") from None
    finally:
        _budget.steps = None


# -- tools ------------------------------------------------------------------------------------

_tool_formats: dict[str, str | None] = {}


def tool_call_format(template: str | None) -> str | None:
    """How a chat template lays out tools: "hermes" when it reads the `tools` variable and shows
    calls as `<tool_call>{json}</tool_call>` (Qwen2.5/3, Hermes, and templates written after them);
    None when it cannot describe tools to the model (it never reads `tools`: SmolLM2-135M's,
    Gemma 3's, no template at all) or calls them in a format reflex does not parse."""
    if template is None:
        return None
    if template not in _tool_formats:
        from jinja2 import meta

        try:
            reads_tools = "tools" in meta.find_undeclared_variables(_jinja_environment().parse(template))
        except Exception:  # a template that does not parse cannot render tools either
            reads_tools = False
        _tool_formats[template] = "hermes" if reads_tools and "<tool_call>" in template else None
    return _tool_formats[template]


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
    if not isinstance(template, str):
        raise RequestError("chat template must be a string")
    compiled = _compiled.get(template)
    if compiled is None:
        if len(template) > MAX_TEMPLATE:
            raise RequestError(f"chat template is {len(template)} characters long (at most {MAX_TEMPLATE})")
        try:
            compiled = _jinja_environment().from_string(template)
        except RecursionError:
            raise RequestError("chat template does not compile: it nests too deeply") from None
        except Exception as e:
            raise RequestError(f"chat template does not compile: {_describe(e)}") from None
        _compiled[template] = compiled
    return compiled


def _jinja_environment():
    global _environment
    if _environment is None:
        _environment = _build_environment()
    return _environment


def _build_environment(budgeted: bool = True):
    """The rendering environment; budgeted=False gives the same one without the render budget
    (tests compare the two on real templates)."""
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

    env_class = _budgeted_environment_class(jinja2, ImmutableSandboxedEnvironment) if budgeted else \
        ImmutableSandboxedEnvironment
    env = env_class(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, namespace=Namespace,
                       dict=DictMaker())
    return env


# -- the render budget --------------------------------------------------------------------------

_WIDTH_METHODS = frozenset({"center", "ljust", "rjust", "zfill", "expandtabs"})
_PRINTF_WIDTH = re.compile(r"%[-#0 +]*(\d*)(?:\.(\d*))?")
_FORMAT_WIDTH = re.compile(r"\{[^{}]*?:[^{}]*?(\d+)")


def _step(n: int = 1) -> None:
    """Spend n steps of this render's budget (and check its deadline every 256 steps)."""
    left = _budget.steps
    if left is None:  # compile-time constant folding, or a render outside render_chat
        return
    left -= n
    _budget.steps = left
    if left < 0:
        raise _BudgetError(f"chat template exceeded its budget of {MAX_STEPS} steps (loop iterations and calls)")
    if left & 255 == 0 and time.monotonic() > _budget.deadline:
        raise _BudgetError(f"chat template exceeded its budget of {MAX_SECONDS:g} s")


class _BudgetError(Exception):
    pass


class _Counted:
    """An iterable with a length that spends one step per item it yields (jinja2's loop.length
    and loop.last keep using len())."""

    __slots__ = ("_items",)

    def __init__(self, items):
        self._items = items

    def __iter__(self):
        for item in self._items:
            _step()
            yield item

    def __len__(self):
        return len(self._items)


def _counted(iterable):
    """What a template loop iterates: `iterable`, spending one step per item."""
    if hasattr(iterable, "__len__"):
        return _Counted(iterable)
    return (_step() or item for item in iterable)


def _too_big(n) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n > MAX_TEXT


def _check_binop(op: str, left, right) -> None:
    sized = (str, list, tuple)
    if op == "*":
        if isinstance(left, sized) and isinstance(right, int) and len(left) * max(right, 0) > MAX_TEXT or \
                isinstance(right, sized) and isinstance(left, int) and len(right) * max(left, 0) > MAX_TEXT:
            raise _BudgetError(f"chat template builds a sequence over {MAX_TEXT} items with *")
    elif op == "+":
        if isinstance(left, sized) and isinstance(right, sized) and len(left) + len(right) > MAX_TEXT:
            raise _BudgetError(f"chat template builds a sequence over {MAX_TEXT} items with +")
    elif op == "**":
        if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and \
                right * max(abs(left).bit_length(), 1) > 4 * MAX_TEXT:
            raise _BudgetError("chat template computes a power too large to print")
    elif op == "%" and isinstance(left, str):
        if any(_too_big(int(w)) for m in _PRINTF_WIDTH.findall(left) for w in m if w):
            raise _BudgetError(f"chat template formats a field wider than {MAX_TEXT}")


def _budgeted_environment_class(jinja2, base):
    """`base` (a sandboxed environment) whose templates spend the render budget: each loop's
    iterable is wrapped by _counted (the code generator does it), each call and intercepted
    operator is checked here."""
    from jinja2 import nodes
    from jinja2.compiler import CodeGenerator
    from jinja2.runtime import LoopContext

    class BudgetCodeGenerator(CodeGenerator):
        def visit_Template(self, node, frame=None):
            for loop in node.find_all(nodes.For):  # every loop iterates _counted(its iterable)
                counted = nodes.ImportedName(f"{__name__}._counted", lineno=loop.lineno)
                loop.iter = nodes.Call(counted, [loop.iter], [], None, None, lineno=loop.lineno)
            super().visit_Template(node, frame)

        def visit_Concat(self, node, frame):
            self.write("environment.rx_concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class BudgetedEnvironment(base):
        code_generator_class = BudgetCodeGenerator
        intercepted_binops = frozenset({"*", "+", "**", "%"})

        @staticmethod
        def rx_concat(parts):
            texts = [p if isinstance(p, str) else str(p) for p in parts]
            if sum(map(len, texts)) > MAX_TEXT:
                raise _BudgetError(f"chat template builds a string over {MAX_TEXT} characters with ~")
            return "".join(texts)

        def call_binop(self, context, operator, left, right):
            _step()
            _check_binop(operator, left, right)
            return super().call_binop(context, operator, left, right)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja2's signature)
            _step()
            if isinstance(__obj, LoopContext) and args:  # a recursive loop's next level
                args = (_counted(args[0]),) + args[1:]
            # str methods, and str.format as the sandbox wraps it (its __wrapped__)
            owner = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)
            if isinstance(owner, str):
                name = getattr(__obj, "__name__", "")
                if name in _WIDTH_METHODS and any(_too_big(a) for a in (*args, *kwargs.values())):
                    raise _BudgetError(f"chat template asks for a string wider than {MAX_TEXT}")
                if name in ("format", "format_map") and any(_too_big(int(w)) for w in _FORMAT_WIDTH.findall(owner)):
                    raise _BudgetError(f"chat template formats a field wider than {MAX_TEXT}")
            return super().call(__context, __obj, *args, **kwargs)

    return BudgetedEnvironment


def _describe(error: Exception) -> str:
    text = " ".join(str(error).split())
    return text if text else type(error).__name__
