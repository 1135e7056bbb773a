"""The fake engine the request-layer and transport tests share: the real Engine class (stop
strings, records, limits are the real code) over a byte-level tokenizer and a scripted runner, so
transport tests run in milliseconds."""

from __future__ import annotations

import codecs
import threading
import time
from types import SimpleNamespace

import pytest

from reflex_runtime.engine import Engine, Limits
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
    """Answers every prompt with REPLY then EOS; `delay` seconds per token; records what it did."""

    name = "fake"

    def __init__(self, reply: str = REPLY, delay: float = 0.0, max_context: int = 512):
        self.reply, self.delay, self.max_context = reply, delay, max_context
        self.started = self.closed = 0
        self.tokens = 0  # tokens produced over all requests
        self.threads: set[str] = set()
        self.busy = threading.Lock()  # proves requests never overlap

    def info(self):
        return {"device": "fake"}

    def generate_ids(self, prompt_ids, params, max_new, stop_ids, logprobs=None, constraint=None):
        """logprobs: scripted values (token j gets -0.1 * (j % 5), its top list the token itself and
        the ids after it); constraints are not followed (the reply is fixed)."""
        assert constraint is None, "the scripted runner cannot follow a grammar"
        assert self.busy.acquire(blocking=False), "two generations ran at once"
        self.started += 1
        self.threads.add(threading.current_thread().name)
        try:
            ids = [b + OFFSET for b in self.reply.encode("utf-8")] + [EOS]
            for step, tok in enumerate(ids[:max_new]):
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
        # A candidate token scores 0 when it matches REPLY at that position, else -5.
        want = [b + OFFSET for b in self.reply.encode("utf-8")]
        return [[0.0 if j < len(want) and t == want[j] else -5.0 for j, t in enumerate(c)] for c in candidates]


class FakeEngine(Engine):
    tools_format = None  # "hermes": the fake template describes tools (tool requests are accepted)

    @property
    def tool_call_format(self):
        return self.tools_format

    def render_messages(self, messages, enable_thinking=None, tools=None):
        head = f"<tools>{len(tools)}\n" if tools else ""
        return head + "".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>"


def make_engine(reply: str = REPLY, delay: float = 0.0, max_context: int = 512, **limits) -> FakeEngine:
    gguf = SimpleNamespace(path="/nonexistent/fake.gguf", get=lambda key: None)
    config = SimpleNamespace(name="fake-model", arch="fake", file_type="F32")
    return FakeEngine(gguf, config, ByteTokenizer(), ScriptedRunner(reply, delay, max_context),
                      model_ref="fake", limits=Limits(**{"max_new_tokens": 256, **limits}))


@pytest.fixture
def engine():
    return make_engine()
