"""Pack a prompt and its candidate continuations into one batch for system1 (pure Python: this
runs on the GPU cold path, where numpy is never imported).

Slots are batch positions in the KV cache; positions are what RoPE sees. Candidate c starts at
position len(prompt) whatever its slot, sees the whole prompt and its own earlier tokens
(`seg_lo` is the slot where its candidate starts), and is scored from the logits of the row
before each of its tokens (the last prompt row for its first token).
"""

from __future__ import annotations


def tree_layout(prompt_ids: list[int], candidates: list[list[int]]):
    """-> (ids, positions, seg_lo, predictors): per batch slot the token id, its RoPE position
    and the first slot of its own segment (0 for prompt tokens); per candidate, the batch row
    whose logits predict each of its tokens."""
    n_p = len(prompt_ids)
    ids = list(prompt_ids)
    positions = list(range(n_p))
    seg_lo = [0] * n_p
    predictors = []
    for cand in candidates:
        start = len(ids)
        rows = []
        for j, tok in enumerate(cand):
            rows.append(n_p - 1 if j == 0 else start + j - 1)
            ids.append(tok)
            positions.append(n_p + j)
            seg_lo.append(start)
        predictors.append(rows)
    return ids, positions, seg_lo, predictors


def tree_tokens(prompt_ids, candidates) -> int:
    """Tokens (and cache slots) a system1 request takes: the prompt and every candidate."""
    return len(prompt_ids) + sum(len(c) for c in candidates)


def tree_allows(slot_q: int, slot_k: int, seg_lo_q: int, prefix_len: int) -> bool:
    """The attention rule the kernels apply: may the token in slot_q see the key in slot_k?"""
    return slot_k <= slot_q and (slot_k < prefix_len or slot_k >= seg_lo_q)
