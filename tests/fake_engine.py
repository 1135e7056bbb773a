"""The fake engine the request-layer and transport tests share: the real Engine class (stop
strings, records, limits are the real code) over a byte-level tokenizer and a scripted runner, so
transport tests run in milliseconds."""

from __future__ import annotations

import codecs
import itertools
import threading
import time
from types import SimpleNamespace

import pytest

from reflex_runtime.engine import Engine, Limits
from reflex_runtime.errors import RequestTimeout
from reflex_runtime.sampling import Sampled

BOS, EOS, OFFSET = 1, 2, 10
REPLY = "Hello world! The quick brown fox."


class ByteTokenizer:
    """One token per UTF-8 byte (id = byte + 10); 1 = BOS, 2 = EOS."""

    bos_id, eos_id, vocab_size = BOS, EOS, 256 + OFFSET
    stop_ids = frozenset({EOS})

    def __init__(self):
        self.threads: set[str] = set()  # where encode() ran

    def encode(self, text, add_special=True, parse_special=True):
        self.threads.add(threading.current_thread().name)
        return ([BOS] if add_special else []) + [b + OFFSET for b in text.encode("utf-8")]

    def token_bytes(self, i):
        return {BOS: b"<bos>", EOS: b"<eos>"}.get(i, bytes([i - OFFSET]) if i >= OFFSET else b"")

    def decode(self, ids, skip_special=False):
        return b"".join(self.token_bytes(i) for i in ids).decode("utf-8", "replace")

    def is_special(self, i):
        return i < OFFSET

    def stream_decoder(self):
        tok, dec = self, codecs.getincrementaldecoder("utf-8")("replace")
        return SimpleNamespace(push=lambda i: dec.decode(tok.token_bytes(i)), flush=lambda: dec.decode(b"", final=True))


class ScriptedRunner:
    """Answers every prompt with REPLY then EOS; `delay` seconds per token, `prefill_s` seconds
    before the first (in 10 steps, the deadline checked before each, as runners do); `fault`, when
    set, is raised by the next generation instead (an engine-side failure); records what it did."""

    name = "fake"
    checks_deadline = True

    def __init__(self, reply: str = REPLY, delay: float = 0.0, max_context: int = 512, prefill_s: float = 0.0):
        self.reply, self.delay, self.max_context, self.prefill_s = reply, delay, max_context, prefill_s
        self.fault: BaseException | None = None
        self.started = self.closed = 0
        self.tokens = 0  # tokens produced over all requests
        self.threads: set[str] = set()
        self.busy = threading.Lock()  # proves requests never overlap

    def info(self):
        return {"device": "fake"}

    def _prefill(self, deadline):
        for j in range(10 if self.prefill_s else 0):
            if deadline is not None and time.perf_counter() > deadline:
                raise RequestTimeout(f"deadline passed after {j} of 10 prefill steps")
            time.sleep(self.prefill_s / 10)
        if self.fault is not None:
            raise self.fault

    def _ids(self, max_new, constraint):
        return [b + OFFSET for b in self.reply.encode("utf-8")] + [EOS]

    def generate_ids(self, prompt_ids, params, max_new, stop_ids, logprobs=None, constraint=None, deadline=None):
        """logprobs: scripted values (token j gets -0.1 * (j % 5), its top list the token itself and
        the ids after it); constraints are not followed (the reply is fixed)."""
        assert constraint is None or isinstance(self, GrammarRunner), "the scripted runner cannot follow a grammar"
        assert self.busy.acquire(blocking=False), "two generations ran at once"
        self.started += 1
        self.threads.add(threading.current_thread().name)
        try:
            self._prefill(deadline)
            for step, tok in enumerate(itertools.islice(self._ids(max_new, constraint), max_new)):
                if self.delay:
                    time.sleep(self.delay)
                self.tokens += 1
                if logprobs is not None:
                    lp = -0.1 * (step % 5)
                    top = [tok] + [OFFSET + (tok + j) % 256 for j in range(1, logprobs)]
                    yield Sampled(tok, lp, top[:logprobs], [lp - j for j in range(len(top[:logprobs]))])
                else:
                    yield tok
                if tok in stop_ids:
                    return
        finally:
            self.closed += 1
            self.busy.release()

    def score(self, prompt_ids, candidates):
        if self.fault is not None:
            raise self.fault
        # A candidate token scores 0 when it matches REPLY at that position, else -5.
        want = [b + OFFSET for b in self.reply.encode("utf-8")]
        return [[0.0 if j < len(want) and t == want[j] else -5.0 for j, t in enumerate(c)] for c in candidates]


class GrammarRunner(ScriptedRunner):
    """Follows a grammar: each token is the lowest id the constraint allows (the reply is then
    whatever the grammar's first choices spell); stops when the constraint allows nothing."""

    def _ids(self, max_new, constraint):
        if constraint is None:
            yield from super()._ids(max_new, None)
            return
        import numpy as np

        words = np.zeros(constraint.words, dtype=np.uint32)
        for _ in range(max_new):
            if not constraint.fill_mask(words.ctypes.data, words.nbytes):
                return
            bits = np.unpackbits(words.view(np.uint8), bitorder="little")
            tok = int(np.flatnonzero(bits)[0])
            constraint.accept(tok)
            yield tok


class FakeEngine(Engine):
    tools_format = None  # "hermes": the fake template describes tools (tool requests are accepted)

    @property
    def tool_call_format(self):
        return self.tools_format

    def render_messages(self, messages, enable_thinking=None, tools=None):
        head = f"<tools>{len(tools)}\n" if tools else ""
        return head + "".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>"


def make_engine(reply: str = REPLY, delay: float = 0.0, max_context: int = 512, prefill_s: float = 0.0,
                grammar: bool = False, **limits) -> FakeEngine:
    """grammar=True: the runner follows response_format / forced tool-call grammars (GrammarRunner)."""
    gguf = SimpleNamespace(path="/nonexistent/fake.gguf", get=lambda key: None)
    config = SimpleNamespace(name="fake-model", arch="fake", file_type="F32", vocab_size=ByteTokenizer.vocab_size)
    runner = (GrammarRunner if grammar else ScriptedRunner)(reply, delay, max_context, prefill_s)
    return FakeEngine(gguf, config, ByteTokenizer(), runner,
                      model_ref="fake", limits=Limits(**{"max_new_tokens": 256, **limits}))


@pytest.fixture
def engine():
    return make_engine()
