"""The engine: one loaded model, its tokenizer, and a runner (CUDA or the numpy reference).

`generate` streams text (prefill, decode, sampling, stop rules); `system1` scores candidate
continuations of a prompt in one pass. Every request ends with one JSON-able record; the first
request of a process also carries the cold-start timeline (process start -> first token).
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Iterator, Protocol

from . import sampling_defaults
from .measure.coldstart import Timeline
from .errors import ReflexError, RequestError, RequestTimeout
from .sampling import MAX_TOP_LOGPROBS, Pick, Sampled, SamplingParams  # noqa: F401 (re-exported for runners' callers)


# `--ctx` and REFLEX_CTX: the context a runner may allocate, in tokens.
CONTEXT_RANGE = (16, 1 << 20)
# `--parallel` / REFLEX_PARALLEL (sequences decoded together) and `--max-queue` / REFLEX_MAX_QUEUE.
PARALLEL_RANGE = (1, 512)  # a decode step's rows are one forward pass (the CUDA runner's MAX_BATCH tokens)
# What serve, uds and the handler hold at once when not told. Their KV cache is one pool of
# blocks they share (kvpool.py), by default room for all of them at the full context (16 x 4,096
# tokens; with the runner's own range for system1, 8.0 GB for Qwen3-0.6B), less where the GPU's
# free memory cannot hold it (gpu/runner.py _fit); `--kv-tokens` / REFLEX_KV_TOKENS sizes it,
# from one context's worth to all of them.
DEFAULT_PARALLEL = 16
KV_TOKENS_RANGE = (16, 1 << 30)
QUEUE_RANGE = (0, 1 << 20)
# What serve, stdio/uds and the handler set Limits.request_timeout_s to unless told otherwise.
DEFAULT_REQUEST_TIMEOUT_S = 60.0


def serving_limits(request_timeout_s: float | None = None) -> "Limits":
    """The Limits of a server front end: `request_timeout_s` None means the default, 0 none."""
    t = DEFAULT_REQUEST_TIMEOUT_S if request_timeout_s is None else request_timeout_s
    return Limits(request_timeout_s=t or None)


@dataclass(frozen=True)
class Limits:
    """Every bound on a request, defined once. The request layer (reflex_runtime/api) checks
    shapes, counts and character lengths before anything is tokenized; the engine checks the
    token counts, which only exist after tokenizing."""

    max_prompt_tokens: int = 8192
    max_new_tokens: int = 4096
    # A chat request that gives no max_tokens gets this many at most (OpenAI would run to the end
    # of the context: minutes on a slow backend, with every other client waiting).
    default_max_tokens: int = 512
    max_candidates: int = 64
    max_candidate_tokens: int = 64
    max_stop_strings: int = 8
    max_stop_chars: int = 1024  # per stop string
    max_messages: int = 2048
    # Text is refused before tokenizing when it has more characters than this many per allowed
    # token: no tokenizer we read has longer tokens than runs of ~31 spaces, and real text
    # averages 2-5 characters a token, so the bound only stops input that could never fit.
    chars_per_token: int = 16
    # Wall-clock budget of one generation on the engine; it then ends as if max_tokens was hit
    # (finish_reason "length", record "time_limited": true). None: no limit (the CLI).
    request_timeout_s: float | None = None
    # JSON schemas (response_format, tool parameters) are bounded before the grammar engine sees
    # them (api/schema_bounds.py): JSON nesting levels inside one schema, objects and arrays in
    # one schema, and $ref hops along any path through it.
    max_schema_depth: int = 64
    max_schema_nodes: int = 10_000
    max_ref_chain: int = 64
    # The scheduler (scheduler.py, serving front ends only): sequences decoded together, requests
    # waiting beyond them before `submit` answers Busy (429), and prompt tokens per step over all
    # prefilling sequences (a long prompt then delays the running decodes by one chunk at most;
    # 512: one forward of the CUDA runner, which packs the chunks of several prompts into it).
    max_seqs: int = 8
    max_queue: int = 256
    prefill_chunk: int = 512

    @property
    def max_prompt_chars(self) -> int:
        return self.max_prompt_tokens * self.chars_per_token

    @property
    def max_candidate_chars(self) -> int:
        return self.max_candidate_tokens * self.chars_per_token


def context_limits(limits: Limits, max_context: int) -> Limits:
    """`limits` with the default prompt bound raised to the context a runner was given past it
    (`--ctx 32768` takes a 20,000-token prompt); a bound someone set is kept."""
    if limits.max_prompt_tokens == Limits.max_prompt_tokens and max_context > limits.max_prompt_tokens:
        return replace(limits, max_prompt_tokens=max_context)
    return limits


@dataclass
class GenerateRequest:
    """A validated generate request (reflex_runtime/api builds them from every transport)."""

    prompt: str | None = None
    messages: list[dict] | None = None
    max_tokens: int = 64
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    chat: bool = False
    enable_thinking: bool | None = None
    ignore_eos: bool = False
    time_limit_s: float | None = None  # see Limits.request_timeout_s
    logprobs: int | None = None  # None: none; k: each token's logprob and the k most likely (k <= 20)
    grammar: object = None  # a grammar.Grammar the output must follow (structured output, forced tool calls)
    tools: list[dict] | None = None  # rendered through the chat template (chat requests only)


@dataclass
class TextDelta:
    text: str
    token_id: int
    logprobs: list[Sampled] | None = None  # the tokens this text came from (logprobs requests)


@dataclass
class Finished:
    record: dict
    text: str
    finish_reason: str  # "stop" | "length"


class Runner(Protocol):
    """What a backend offers the engine (gpu/runner.py, reference/runner.py)."""

    name: str
    max_context: int

    def generate_ids(self, prompt_ids: list[int], params: SamplingParams, max_new: int, stop_ids: frozenset,
                     logprobs: int | None = None, constraint=None) -> Iterator[int | Sampled]:
        """Yield sampled ids; the first after prefill. Stops after a stop id or max_new ids.
        deadline (a time.perf_counter() value; only for runners whose `checks_deadline` is true):
        checked between prefill chunks, RequestTimeout when passed before the first id.
        logprobs=k (0..MAX_TOP_LOGPROBS): yield Sampled instead, from the same logits the pick used.
        constraint (grammar.Constraint): before each pick `constraint.fill_mask(ptr, nbytes)` writes
        the allowed tokens' bitmask (False: none allowed, stop), the pick sees only those, and
        `constraint.accept(id)` follows. Runners without these features may omit the keywords: the
        engine passes them only when a request asks."""

    def score(self, prompt_ids: list[int], candidates: list[list[int]]) -> list[list[float]]:
        """log P(token | prompt, earlier candidate tokens) for every candidate token."""

    def info(self) -> dict:
        """Backend facts for the record (device, kernel format...)."""


class Engine:
    """Load once, serve many requests: one at a time on the caller's thread, or, once
    start_scheduler() ran (serving front ends), from many threads through the scheduler."""

    def __init__(self, gguf, config, tokenizer, runner: Runner, timeline: Timeline | None = None,
                 model_ref: str = "", limits: Limits | None = None, fallback_reason: str | None = None,
                 index_cached: bool = True):
        self.gguf = gguf
        self.config = config
        self.tokenizer = tokenizer
        self.runner = runner
        self.timeline = timeline
        self.model_ref = model_ref
        self.limits = context_limits(limits or Limits(), runner.max_context)
        self.fallback_reason = fallback_reason  # why the GPU is not used, when it could have been
        self.index_cached = index_cached  # False: persist_index() writes the model index
        self.requests_served = 0
        # The engine-side failure of the last request (the model file unreadable, the device
        # lost), None once a request succeeds: health answers 503 with it (api/model_state.py).
        self.fault: ReflexError | None = None
        self._chat_template = gguf.get("tokenizer.chat_template")
        # What a request's left-out sampling fields get: the file's general.sampling.*, else greedy.
        self.sampling_defaults = sampling_defaults.from_gguf(gguf)
        self.scheduler = None  # scheduler.Scheduler once start_scheduler() ran
        self._lock = threading.Lock()  # requests_served and the cold-start timeline's one owner
        self._timeline_taken = False

    def start_scheduler(self, max_seqs: int | None = None, max_queue: int | None = None, energy=None):
        """Serve through one scheduler thread (scheduler.py) from now on. `energy`: a callable
        returning a total-energy counter in millijoules (default: the runner's `energy_counter`,
        when it has one), shared among the requests as their record's joules_attributed."""
        from .scheduler import Scheduler

        if max_seqs is None:  # the runner's own default (the CUDA runner may pick one for its GPU)
            max_seqs = getattr(self.runner, "default_seqs", None) or getattr(self.runner, "max_seqs", 1)
        changes = {k: v for k, v in (("max_seqs", max_seqs), ("max_queue", max_queue)) if v is not None}
        self.limits = replace(self.limits, **changes)
        if energy is None:
            energy = getattr(self.runner, "energy_counter", None)
        self.scheduler = Scheduler(self.runner, self.limits, energy)
        return self.scheduler

    def stop_scheduler(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop()

    def _take_timeline(self) -> Timeline | None:
        """The cold-start timeline for the first request only, even when several start at once."""
        with self._lock:
            if self.timeline is None or self.requests_served or self._timeline_taken:
                return None
            self._timeline_taken = True
            return self.timeline

    def _served(self) -> None:
        with self._lock:
            self.requests_served += 1

    def _give_back(self, tl) -> None:
        """A request that took the timeline and failed: the next one reports the cold start."""
        if tl is not None:
            with self._lock:
                self._timeline_taken = self.requests_served > 0

    def persist_index(self) -> bool:
        """Save the parsed header and tokenizer tables for the next cold start of this file
        (modelcache.py). Call it after a response has gone out: it is never worth a delay."""
        if self.index_cached:
            return False
        from .modelfile import modelcache

        self.index_cached = modelcache.save(self.gguf.path, self.gguf, self.tokenizer)
        return self.index_cached

    # -- prompts ---------------------------------------------------------------------------

    @property
    def model_name(self) -> str:
        return self.config.name or os.path.basename(self.gguf.path)

    @property
    def chat_notice(self) -> str | None:
        """None when the file carries a chat template; else the one line that says what a chat
        prompt gets instead (the CLI prints it; chat requests carry it in their record)."""
        if self._chat_template is not None:
            return None
        from .text.chat import fallback_name

        return (f"this model file has no chat template (a base model, not tuned to chat): messages are laid out "
                f"in the plain {fallback_name(self.config.arch)} format and the reply is a continuation, not an "
                f"answer; for chat, use an instruct model (e.g. --model smollm2)")

    @property
    def tool_call_format(self) -> str | None:
        """How this model's chat template describes tools and its output calls them ("hermes":
        `<tool_call>{json}</tool_call>`), or None when the template cannot render tools."""
        from .text.chat import tool_call_format

        return tool_call_format(self._chat_template)

    def render_messages(self, messages: list[dict], enable_thinking: bool | None = None,
                        tools: list[dict] | None = None) -> str:
        from .text.chat import render_chat

        tok = self.tokenizer
        bos = tok.decode([tok.bos_id]) if tok.bos_id is not None else ""
        eos = tok.decode([tok.eos_id]) if tok.eos_id is not None else ""
        return render_chat(self._chat_template, messages, add_generation_prompt=True,
                           enable_thinking=enable_thinking, tools=tools or None, bos_token=bos, eos_token=eos,
                           architecture=self.config.arch)

    def prompt_ids(self, prompt: str | None = None, messages: list[dict] | None = None,
                   chat: bool = False, enable_thinking: bool | None = None, tools: list[dict] | None = None) -> list[int]:
        if messages is None and prompt is None:
            raise RequestError("a 'prompt' or 'messages' is required", field="prompt")
        if messages is None and chat:
            messages = [{"role": "user", "content": prompt}]
        if messages is not None:
            text = self.render_messages(messages, enable_thinking, tools)
            tok = self.tokenizer
            bos_text = tok.decode([tok.bos_id]) if tok.bos_id is not None else None
            # Templates that write the BOS text themselves must not get a second BOS.
            add_special = not (bos_text and text.startswith(bos_text))
            ids = tok.encode(text, add_special=add_special, parse_special=True)
        else:
            if not isinstance(prompt, str):
                raise RequestError("'prompt' must be a string", field="prompt")
            ids = self.tokenizer.encode(prompt, add_special=True, parse_special=True)
        if not ids:
            raise RequestError("the prompt encodes to no tokens", field="prompt")
        if len(ids) > self.limits.max_prompt_tokens:
            raise RequestError(f"prompt has {len(ids)} tokens, the limit is {self.limits.max_prompt_tokens}", field="prompt")
        return ids

    # -- generate --------------------------------------------------------------------------

    def _watch(self, work):
        """Run a generation, keeping `fault` current (see __init__)."""
        try:
            yield from work
        except ReflexError as e:
            self._note_fault(e)
            raise
        self.fault = None

    def _note_fault(self, e: ReflexError) -> None:
        if e.http_status >= 500 and not isinstance(e, (RequestError, RequestTimeout)):
            self.fault = e

    def generate(self, req: GenerateRequest, prompt_ids: list[int] | None = None, gone=None) -> Iterator[TextDelta | Finished]:
        """Stream TextDelta events, then one Finished with the request record. `req` comes
        validated from reflex_runtime/api (api.direct_ops.parse_generate and the OpenAI mapping).
        Raises RequestTimeout when the time limit passes during the prefill, and RequestError
        naming the grammar's field when the grammar engine fails mid-way (its output could not
        be valid). `gone()`: whether the client left; the scheduler asks it until the first token
        (a request whose client left while it waited never starts)."""
        return self._watch(self._generate(req, prompt_ids, gone))

    def _generate(self, req: GenerateRequest, prompt_ids: list[int] | None, gone=None):
        assert 1 <= req.max_tokens <= self.limits.max_new_tokens, req.max_tokens
        t_req = time.perf_counter()
        ids = prompt_ids if prompt_ids is not None else self.prompt_ids(req.prompt, req.messages, req.chat,
                                                                         req.enable_thinking, req.tools)
        if len(ids) + req.max_tokens > self.runner.max_context:
            raise RequestError(
                f"prompt ({len(ids)} tokens) + max_tokens ({req.max_tokens}) exceeds the context of {self.runner.max_context}",
                field="max_tokens")
        params = req.sampling
        if params.seed is None and params.temperature > 0:
            params = SamplingParams(params.temperature, params.top_k, params.top_p, params.min_p,
                                    int.from_bytes(os.urandom(8), "little") >> 1)
        tl = self._take_timeline()
        try:
            yield from self._decode(req, ids, params, tl, t_req, gone)
        finally:
            self._give_back(tl)

    def _tokens(self, ids, pick: Pick, max_new: int, stop_ids, deadline, gone):
        """The request's token source: the scheduler's ticket, or the runner's own loop."""
        if self.scheduler is not None:
            return self.scheduler.submit(ids, pick, max_new, stop_ids, deadline, gone)
        extra = {}
        if pick.logprobs is not None:
            extra["logprobs"] = pick.logprobs
        if pick.constraint is not None:
            extra["constraint"] = pick.constraint
        if deadline is not None and getattr(self.runner, "checks_deadline", False):
            extra["deadline"] = deadline
        return self.runner.generate_ids(ids, pick.params, max_new, stop_ids, **extra)

    def _decode(self, req: GenerateRequest, ids, params, tl, t_req, gone):
        stops = tuple(req.stop or ())
        if tl:
            tl.mark("prompt")
        stop_ids = frozenset() if req.ignore_eos else self.tokenizer.stop_ids
        decoder = self.tokenizer.stream_decoder()
        text_parts: list[str] = []
        pending = ""  # text held back while it could still become a stop string
        hold = max((len(s) for s in stops), default=0) - 1
        n_gen = 0
        finish = "length"
        t_first = None
        deadline = t_req + req.time_limit_s if req.time_limit_s else None
        timed_out = False
        constraint = None
        if req.grammar is not None:
            constraint = req.grammar.constraint(self.tokenizer, self.config.vocab_size, stop_ids)
        lps: list[Sampled] = []  # logprobs of tokens whose text is not out yet
        gen = self._tokens(ids, Pick(params, req.logprobs, constraint), req.max_tokens, stop_ids, deadline, gone)
        # A ticket's constraint runs on the scheduler thread, maybe ahead of this loop: its state is
        # this loop's only once the ticket ended (the scheduler ends it where the grammar finished).
        scheduled = self.scheduler is not None
        exhausted = False
        try:
            for tok in gen:
                if isinstance(tok, Sampled):
                    sampled, tok = tok, tok.token_id
                n_gen += 1
                if t_first is None:
                    t_first = time.perf_counter()
                    if tl:
                        tl.mark("first_token")
                elif tl:
                    tl.token()
                if tok in stop_ids:
                    finish = "stop"
                    break
                if req.logprobs is not None:
                    lps.append(sampled)
                pending += decoder.push(tok)
                cut = _find_stop(pending, stops)
                if cut is not None:
                    pending = pending[:cut]
                    finish = "stop"
                    break
                emit = pending[: max(0, len(pending) - hold)] if hold > 0 else pending
                if emit:
                    pending = pending[len(emit):]
                    text_parts.append(emit)
                    yield TextDelta(emit, tok, lps or None)
                    lps = []
                if constraint is not None and not scheduled and constraint.finished:
                    break  # the grammar is complete: only a stop token could follow
                if deadline is not None and time.perf_counter() > deadline:
                    timed_out = True  # ends like max_tokens: finish "length"
                    break
            else:
                exhausted = True
        except RequestTimeout:
            raise RequestTimeout(f"the request timeout of {req.time_limit_s:g} s passed while the prompt ({len(ids)} "
                                 "tokens) was processed: shorten it or raise the timeout (--request-timeout, "
                                 "REFLEX_REQUEST_TIMEOUT)") from None
        finally:
            gen.close()
        settled = exhausted or not scheduled
        if constraint is not None and settled and constraint.failure:
            raise req.grammar.failed(constraint.failure)
        if constraint is not None and settled and constraint.finished and not timed_out and finish == "length":
            finish = "stop"
            pending += decoder.flush()
        if finish == "length":
            pending += decoder.flush()
            cut = _find_stop(pending, stops)
            if cut is not None:
                pending, finish = pending[:cut], "stop"
        if pending or lps:
            text_parts.append(pending)
            yield TextDelta(pending, -1, lps or None)
        t_end = time.perf_counter()
        if tl:
            tl.mark("last_token")
        self._served()
        rec = self._record("generate", ids, n_gen, t_req, t_first, t_end, params, finish, tl)
        if scheduled:
            rec.update(gen.stats(self.scheduler.energy is not None))
        if timed_out:
            rec["time_limited"] = True
        if constraint is not None:
            rec["constrained"] = req.grammar.kind
        if req.messages is not None or req.chat:
            self._chat_fields(rec)
        yield Finished(rec, "".join(text_parts), finish)

    def _chat_fields(self, rec: dict) -> None:
        """A chat request's record says which template laid out its messages, and when the file
        has none, the notice (see chat_notice)."""
        if self._chat_template is not None:
            rec["chat_template"] = "model"
            return
        from .text.chat import fallback_name

        rec["chat_template"] = f"none (plain {fallback_name(self.config.arch)} fallback)"
        rec["notice"] = self.chat_notice

    def _record(self, op, ids, n_gen, t_req, t_first, t_end, params, finish, tl) -> dict:
        decode_s = (t_end - t_first) if t_first else 0.0
        rec = {
            "op": op,
            "model": self.model_name,
            "architecture": self.config.arch,
            "file_type": self.config.file_type,
            "backend": self.runner.name,
            "prompt_tokens": len(ids),
            "generated_tokens": n_gen,
            "finish_reason": finish,
            "seed": params.seed,
            "request_to_first_token_ms": round((t_first - t_req) * 1000, 3) if t_first else None,
            "request_ms": round((t_end - t_req) * 1000, 3),
            "decode_tokens_per_s": round((n_gen - 1) / decode_s, 2) if n_gen > 1 and decode_s > 0 else None,
            "cold_start": tl is not None,
        }
        if op == "generate":  # what the request's sampling resolved to (sampling_defaults.py)
            rec["sampling"] = {"temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p,
                               "min_p": params.min_p}
        rec.update(self.runner.info())
        if tl is not None:
            rec["coldstart"] = tl.record()
        return rec

    # -- system1 ---------------------------------------------------------------------------

    def system1(self, prompt: str | None = None, candidates: list[str] | None = None, messages: list[dict] | None = None,
                chat: bool = False, emit=None) -> dict:
        """Score each candidate continuation: sum of its tokens' log-probabilities after the prompt.
        emit(result) is called with the scores before the request record is built: the record's
        energy reading waits for the GPU's energy counter to tick (up to ~0.1 s), the answer need not."""
        try:
            result = self._system1(prompt, candidates, messages, chat, emit)
        except ReflexError as e:
            self._note_fault(e)
            raise
        self.fault = None
        return result

    def _system1(self, prompt, candidates, messages, chat, emit) -> dict:
        assert candidates and len(candidates) <= self.limits.max_candidates  # checked by reflex_runtime/api
        cand_ids = []
        for i, c in enumerate(candidates):
            # The candidate text is encoded on its own, without BOS: it continues the prompt.
            toks = self.tokenizer.encode(c, add_special=False, parse_special=False)
            if not toks:
                raise RequestError(f"candidate {i} ({c!r}) encodes to no tokens", field="candidates")
            if len(toks) > self.limits.max_candidate_tokens:
                raise RequestError(f"candidate {i} has {len(toks)} tokens, the limit is {self.limits.max_candidate_tokens}",
                                   field="candidates")
            cand_ids.append(toks)
        t_req = time.perf_counter()
        ids = self.prompt_ids(prompt, messages, chat)
        if len(ids) + sum(len(c) for c in cand_ids) > self.runner.max_context:
            raise RequestError(f"prompt + candidates exceed the context of {self.runner.max_context}", field="candidates")
        tl = self._take_timeline()
        try:
            result = self._scored(prompt, candidates, messages, chat, emit, cand_ids, ids, t_req, tl)
        finally:
            self._give_back(tl)
        return result

    def _scored(self, prompt, candidates, messages, chat, emit, cand_ids, ids, t_req, tl) -> dict:
        if tl:
            tl.mark("prompt")
        # Identical token sequences are scored once: same work, and bit-identical scores by construction.
        unique: dict[tuple, int] = {}
        for c in cand_ids:
            unique.setdefault(tuple(c), len(unique))
        batch = [list(u) for u in unique]
        stats = None
        if self.scheduler is not None:
            scored, stats = self.scheduler.score(ids, batch)
        else:
            scored = self.runner.score(ids, batch)
        logprobs = [scored[unique[tuple(c)]] for c in cand_ids]
        t_end = time.perf_counter()
        if tl:
            tl.mark("first_token")  # system1's result is its "first token"
        scores = [float(sum(lp)) for lp in logprobs]
        top = max(scores)
        weights = [math.exp(s - top) for s in scores]
        total = sum(weights)
        probs = [w / total for w in weights]
        best = max(range(len(scores)), key=lambda i: (scores[i], -i))
        entropy = -sum(p * math.log(p) for p in probs if p > 0)
        self._served()
        result = {
            "candidates": [
                {"index": i, "text": c, "token_ids": t, "token_logprobs": [round(x, 6) for x in lp],
                 "score": s, "probability": p}
                for i, (c, t, lp, s, p) in enumerate(zip(candidates, cand_ids, logprobs, scores, probs))
            ],
            "best_index": best,
            "best_text": candidates[best],
            "entropy": entropy,
            "probability_note": "softmax of the scores over this candidate set only, not a probability over the vocabulary",
        }
        if tl is not None:
            result["process_start_to_result_ms"] = round(tl.mark_time("first_token") * 1000, 3)
        if emit is not None:
            emit(result)
        result["record"] = self._record("system1", ids, 0, t_req, t_end, t_end, SamplingParams(), "scored", tl)
        if stats:
            result["record"].update(stats)
        if messages is not None or chat:
            self._chat_fields(result["record"])
        return result


def _find_stop(text: str, stops: tuple[str, ...]) -> int | None:
    best = None
    for s in stops:
        i = text.find(s)
        if i >= 0 and (best is None or i < best):
            best = i
    return best

