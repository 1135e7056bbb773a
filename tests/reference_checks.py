"""Helpers shared by the reference-vs-transformers tests of every architecture."""

from __future__ import annotations

import numpy as np

TOL = 1e-4  # max relative error per position: max|ours - theirs| / max|theirs|


def rel_err(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row: max|a - b| / max|b|."""
    a, b = np.atleast_2d(a), np.atleast_2d(b)
    return np.abs(a - b).max(axis=-1) / np.abs(b).max(axis=-1)


def prompt(n: int, seed: int = 7, vocab: int = 151643) -> np.ndarray:
    """n random token ids below the first special token of the Qwen vocabularies."""
    return np.random.default_rng(seed).integers(4, min(vocab, 151643), size=n)


def hf_logits(model, ids) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.as_tensor(np.asarray(ids), dtype=torch.long)[None]).logits[0].float().numpy()


def greedy_reference(model, ids, n_new: int):
    """(tokens, logits before each token) of greedy decoding with the reference and its cache."""
    cache = model.new_cache(len(ids) + n_new)
    logits = model.forward(ids, cache)[-1]
    out, steps = [], []
    for _ in range(n_new):
        steps.append(logits)
        out.append(int(np.argmax(logits)))
        logits = model.forward([out[-1]], cache)[-1]
    return out, np.stack(steps)


def hf_greedy(model, ids, n_new: int):
    """(tokens, logits) of transformers' own greedy generate, with no stopping token."""
    import torch
    from transformers import GenerationConfig

    gen = GenerationConfig(max_new_tokens=n_new, do_sample=False, eos_token_id=None, pad_token_id=0,
                           output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        out = model.generate(torch.as_tensor(np.asarray(ids))[None], generation_config=gen)
    return out.sequences[0, len(ids):].tolist(), torch.cat(out.logits).float().numpy()


def assert_greedy_matches_generate(ref, hf, ids, n_new: int = 16, label: str = "") -> None:
    """Same greedy tokens as transformers' generate, step logits within TOL, and not degenerate."""
    tokens, steps = greedy_reference(ref, ids, n_new)
    want_tokens, want_logits = hf_greedy(hf, ids, n_new)
    assert tokens == want_tokens, f"{label}: {tokens} != {want_tokens}"
    err = rel_err(steps, want_logits)
    assert err.max() < TOL, f"{label}: relative error per step {err}"
    assert len(set(tokens)) > 1, "the random fixture collapsed to one token: logits are degenerate"
