"""`logprobs` in the OpenAI shapes, from the engine's Sampled tokens (engine.TextDelta.logprobs).

- chat: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}],
  "refusal": None}` (a stream chunk carries the entries of its own tokens);
- completions (the legacy object): `{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}],
  "text_offset"}`.
Token strings are the token's bytes as UTF-8, bytes that do not decode on their own (a piece of a
character) spelled `\\xNN`; `bytes` always has the exact bytes.
"""

from __future__ import annotations


def token_text(tokenizer, token_id: int) -> tuple[str, list[int]]:
    b = tokenizer.token_bytes(token_id)
    return b.decode("utf-8", "backslashreplace"), list(b)


def chat_entries(tokenizer, sampled: list) -> list[dict]:
    out = []
    for s in sampled:
        text, raw = token_text(tokenizer, s.token_id)
        top = []
        for i, lp in zip(s.top_ids, s.top_logprobs):
            t, b = token_text(tokenizer, i)
            top.append({"token": t, "logprob": lp, "bytes": b})
        out.append({"token": text, "logprob": s.logprob, "bytes": raw, "top_logprobs": top})
    return out


def chat_logprobs(tokenizer, sampled: list) -> dict:
    return {"content": chat_entries(tokenizer, sampled), "refusal": None}


def completion_logprobs(tokenizer, sampled: list, offset: int, want_top: bool) -> tuple[dict, int]:
    """The legacy object for these tokens, their text offsets counted from `offset` (characters
    of the completion before them); returns it and the offset after them."""
    tokens, lps, tops, offsets = [], [], [], []
    for s in sampled:
        text, _ = token_text(tokenizer, s.token_id)
        tokens.append(text)
        lps.append(s.logprob)
        offsets.append(offset)
        offset += len(text)
        if want_top:
            tops.append({token_text(tokenizer, i)[0]: lp for i, lp in zip(s.top_ids, s.top_logprobs)})
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops if want_top else None,
            "text_offset": offsets}, offset
