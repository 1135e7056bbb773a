"""Constrained decoding: a grammar (a JSON schema, any JSON object, or a Lark grammar) turned into
a per-token mask of allowed token ids, through llguidance (the Rust library behind Guidance;
docs/PERFORMANCE_NOTES.md has the measurements it was picked by).

Cold path: nothing here is imported unless a request asks for structured output; `llguidance`
(~15 ms to import) is imported on the first such request, and the llguidance view of the
vocabulary (~2 s for Qwen3's 151k tokens on a 2-core VM, scripts/bench_grammar.py) is built once
per tokenizer and kept.

    spec = Grammar.json_schema(schema, field="response_format.json_schema.schema")
    spec.check()                          # RequestError naming `field` when the grammar is invalid
    c = spec.constraint(tokenizer, vocab_size, stop_ids)
    c.fill_mask(ptr, nbytes)              # bitmask of the tokens allowed next (bit i of word i // 32)
    c.accept(token_id)                    # after sampling
    c.finished                            # the grammar is complete: nothing but a stop may follow
    c.failure                             # why the grammar engine could not go on (one line), or None

Every compile (check, constraint) runs through native_guard: on a large-stack thread with a time
limit, so a schema that makes llguidance recurse deeply cannot overflow the caller's stack (the
request layer bounds schemas first: api/schema_bounds.py). llguidance's errors are asked for in
their short form (no parser-state dump) and cut to one line.

The mask is a little-endian bitmask of ceil(vocab / 32) uint32 words: the runners apply it before
argmax / sampling (reference/sampling.py; on the GPU gpu/constrained.py, kernels/constrain.cu).
When the grammar allows its end, every stop id of the request is allowed too (llguidance knows
one end-of-sequence token; chat models end a turn with another).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass

from . import native_guard
from ..errors import RequestError

COMPILE_TIMEOUT_S = 10.0  # one compile; measured compiles take 1-100 ms (tests/test_schema_fuzz.py)
_lock = threading.Lock()
_tokenizers: dict[int, tuple[object, object]] = {}  # id(Tokenizer) -> (Tokenizer, LLTokenizer)

# JSON layout of generated objects: compact separators, no free whitespace (a small model would
# otherwise pad with newlines until max_tokens), as OpenAI's structured outputs print them.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def mask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def _llg():
    import llguidance  # only on the first structured request

    return llguidance


def _limits():
    """llguidance's default resource limits, with errors in their one-line form."""
    return _llg().LLParserLimits(verbose_errors=False)


@dataclass(frozen=True)
class Grammar:
    """What a request constrains its output to. `kind`: "json_schema" | "json_object" | "lark".
    `field` names the request field an invalid grammar is reported against."""

    kind: str
    source: str  # the schema (JSON text) or the Lark grammar
    field: str = "response_format"

    @classmethod
    def json_schema(cls, schema: dict, field: str) -> "Grammar":
        return cls("json_schema", json.dumps(schema), field)

    @classmethod
    def json_object(cls, field: str = "response_format") -> "Grammar":
        return cls("json_object", json.dumps({"type": "object"}), field)

    @classmethod
    def lark(cls, text: str, field: str) -> "Grammar":
        return cls("lark", text, field)

    def llguidance_grammar(self) -> str:
        llg = _llg()
        if self.kind == "lark":
            return llg.LLMatcher.grammar_from_lark(self.source)
        try:
            return llg.LLMatcher.grammar_from_json_schema(self.source, defaults=JSON_OPTIONS)
        except ValueError as e:
            raise RequestError(f"'{self.field}' is not a valid JSON schema: {_one_line(e)}", field=self.field) from None

    def check(self) -> None:
        """Compile without a vocabulary: an invalid or unsupported schema is a RequestError naming
        the field (before anything is generated)."""
        def validate():
            return _llg().LLMatcher.validate_grammar(self.llguidance_grammar(), limits=_limits())

        msg = self._guarded(validate)
        if msg and not msg.startswith("WARNING"):
            raise RequestError(f"'{self.field}' cannot be used: {_one_line(msg)}", field=self.field)

    def constraint(self, tokenizer, vocab_size: int, stop_ids=frozenset()) -> "Constraint":
        llg, lt = _llg(), lltokenizer(tokenizer, vocab_size)
        m = self._guarded(lambda: llg.LLMatcher(lt, self.llguidance_grammar(), log_level=0, limits=_limits()))
        if m.is_error():
            raise RequestError(f"'{self.field}' cannot be used: {_one_line(m.get_error())}", field=self.field)
        return Constraint(m, vocab_size, tokenizer.eos_id, stop_ids)

    def failed(self, reason: str) -> RequestError:
        """The error of a generation whose grammar engine gave up before a valid end."""
        return RequestError(f"'{self.field}' could not be followed to the end of a valid output: {reason}",
                            field=self.field)

    def _guarded(self, fn):
        try:
            return native_guard.call(fn, timeout=COMPILE_TIMEOUT_S)
        except native_guard.NativeTimeout:
            raise RequestError(f"'{self.field}' did not compile within {COMPILE_TIMEOUT_S:g} s: simplify it",
                               field=self.field) from None
        except native_guard.NativeBusy:
            raise RequestError("every grammar compile slot is busy with a slow compile; retry later", status=503,
                               code="grammar_busy") from None


class Constraint:
    """One request's matcher. The runner calls fill_mask before each pick and accept after it."""

    def __init__(self, matcher, vocab_size: int, eos_id: int | None, stop_ids):
        self._m = matcher
        self.vocab_size = vocab_size
        self.words = mask_words(vocab_size)
        self._eos = eos_id
        self._stops = frozenset(stop_ids)
        self.tokens = 0  # accepted so far
        self._empty = False  # a mask allowed nothing while the matcher reported no error

    def fill_mask(self, ptr: int, nbytes: int) -> bool:
        """Write the allowed-token bitmask for the next position into host memory at ptr
        (nbytes >= 4 * words). False: nothing is allowed (the grammar failed): stop generating."""
        import ctypes

        assert nbytes >= 4 * self.words
        m = self._m
        if m.is_error():
            return False
        m.unsafe_compute_mask_ptr(ptr, 4 * self.words)
        words = (ctypes.c_uint32 * self.words).from_address(ptr)
        if self._eos is not None and self._eos < self.vocab_size and words[self._eos >> 5] >> (self._eos & 31) & 1:
            for s in self._stops:  # the end of the grammar: every stop id of the request may end it
                if 0 <= s < self.vocab_size:
                    words[s >> 5] |= 1 << (s & 31)
        if m.is_error():
            return False
        self._empty = not any(words)
        return not self._empty

    def accept(self, token_id: int) -> bool:
        """Advance past a sampled token; a stop id ends the generation and is not fed in."""
        self.tokens += 1
        if token_id in self._stops and token_id != self._eos:
            return True
        return self._m.consume_token(token_id)

    @property
    def finished(self) -> bool:
        """The grammar is complete and cannot grow: the generation may end here."""
        return self._m.is_stopped()

    @property
    def error(self) -> str | None:
        return _one_line(self._m.get_error()) if self._m.is_error() else None

    @property
    def failure(self) -> str | None:
        """Why generation had to stop short of a valid end (one line), or None."""
        if self._m.is_error():
            return self.error
        return "the grammar allowed no next token" if self._empty else None


def lltokenizer(tokenizer, vocab_size: int):
    """llguidance's view of a reflex Tokenizer (built once per tokenizer: every token's bytes,
    special tokens marked with a leading 0xFF so grammars never match them as text)."""
    with _lock:
        hit = _tokenizers.get(id(tokenizer))
        if hit is not None and hit[0] is tokenizer:
            return hit[1]
        llg = _llg()
        n = tokenizer.vocab_size
        special = [i for i in range(n) if tokenizer.is_special(i)]
        marked = set(special)
        tokens = [(b"\xff" if i in marked else b"") + tokenizer.token_bytes(i) for i in range(n)]
        tokens += [b""] * max(0, vocab_size - n)  # padded rows of the output matrix: never allowed

        class _Wrapped:
            eos_token_id = tokenizer.eos_id if tokenizer.eos_id is not None else 0
            bos_token_id = tokenizer.bos_id
            special_token_ids = special

            def __call__(self, text: bytes) -> list[int]:
                return tokenizer.encode(text.decode("utf-8", "replace"), add_special=False, parse_special=False)

        _Wrapped.tokens = tokens
        # JSON slices: every grammar reflex builds is JSON (schemas, json_object, forced tool calls);
        # on Qwen3's vocabulary they cut the p99 mask time ~1.6x against the general ones
        # (scripts/bench_grammar.py) for the same ~1.5 s build.
        lt = llg.LLTokenizer(llg.TokenizerWrapper(_Wrapped()), n_vocab=max(n, vocab_size),
                             slices=llg.LLTokenizer.json_slices())
        _tokenizers[id(tokenizer)] = (tokenizer, lt)
        return lt


def _one_line(e) -> str:
    """llguidance's message: its first line (short-form errors end with a `<non-verbose/>` line),
    whitespace collapsed, at most 300 characters."""
    lines = [ln for ln in str(e).splitlines() if ln.strip() and ln.strip() != "<non-verbose/>"]
    text = " ".join(" ".join(lines[:1]).split())
    return text if len(text) <= 300 else text[:297] + "..."
