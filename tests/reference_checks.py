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
    # generate() fills unset fields from the model's own generation config, EOS included: clear it
    # there too, so a fixture that happens to emit its EOS id (llama's is 2) keeps going.
    saved, model.generation_config.eos_token_id = model.generation_config.eos_token_id, None
    try:
        with torch.no_grad():
            out = model.generate(torch.as_tensor(np.asarray(ids))[None], generation_config=gen)
    finally:
        model.generation_config.eos_token_id = saved
    return out.sequences[0, len(ids):].tolist(), torch.cat(out.logits).float().numpy()


def assert_greedy_matches_generate(ref, hf, ids, n_new: int = 16, label: str = "") -> None:
    """Same greedy tokens as transformers' generate, step logits within TOL, and not degenerate."""
    tokens, steps = greedy_reference(ref, ids, n_new)
    want_tokens, want_logits = hf_greedy(hf, ids, n_new)
    assert tokens == want_tokens, f"{label}: {tokens} != {want_tokens}"
    err = rel_err(steps, want_logits)
    assert err.max() < TOL, f"{label}: relative error per step {err}"
    assert len(set(tokens)) > 1, "the random fixture collapsed to one token: logits are degenerate"


def assert_prefill_equals_steps(ref, ids, split: int = 7) -> None:
    """One prefill == token by token == two chunks (the second on top of a cache)."""
    n = len(ids)
    once = ref.forward(ids, ref.new_cache(n))
    cache = ref.new_cache(n)
    steps = np.concatenate([ref.forward([t], cache) for t in ids])
    assert cache.length == n
    assert rel_err(steps, once).max() < 1e-5
    cache = ref.new_cache(n)
    chunks = np.concatenate([ref.forward(ids[:split], cache), ref.forward(ids[split:], cache)])
    assert rel_err(chunks, once).max() < 1e-5


def tree_6_5_4():
    """Positions and mask of a 6-token prompt with two branches of 5 and 4 tokens in one batch
    (how system1 packs candidates): each branch sees the prompt and its own earlier tokens."""
    n = 15
    pos = np.r_[np.arange(6), 6 + np.arange(5), 6 + np.arange(4)]
    mask = np.zeros((n, n), dtype=bool)
    mask[:6, :6] = np.tril(np.ones((6, 6), dtype=bool))
    mask[6:11, :6] = True
    mask[6:11, 6:11] = np.tril(np.ones((5, 5), dtype=bool))
    mask[11:, :6] = True
    mask[11:, 11:] = np.tril(np.ones((4, 4), dtype=bool))
    return pos, mask


def assert_copy_is_independent(ref, ids):
    """Fork a cache after the prompt ids[:6], extend the original with ids[6:10]: the fork then
    continues with ids[10:] exactly as if it had never seen them. Returns the extended cache."""
    p, a, b = ids[:6], ids[6:10], ids[10:]
    sep_b = ref.forward(np.r_[p, b], ref.new_cache(len(p) + len(b)))
    cache = ref.new_cache(16)
    ref.forward(p, cache)
    fork = cache.copy()
    ref.forward(a, cache)
    assert (cache.length, fork.length) == (10, 6)
    assert rel_err(ref.forward(b, fork), sep_b[6:]).max() < 1e-5  # the copy did not see `a`
    return cache
