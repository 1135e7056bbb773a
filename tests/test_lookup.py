"""text/lookup.py: a SortedLookup answers exactly as the dict it stands in for (a token text's last
id, a merge's first rank), on real vocabularies and on keys repeated across slice boundaries."""

import random

import pytest

from reflex_runtime.modelfile.gguf_file import GGUFFile
from reflex_runtime.text.lookup import SLICE, OrderError, SortedLookup, first_wins, last_wins, sliced_dict, sorted_order


def _agree(keys, absent):
    for last, build in ((True, last_wins), (False, first_wins)):
        want = build(keys)
        got = SortedLookup(keys, sorted_order(keys, last=last))
        assert {k: got[k] for k in want} == want
        assert all(k in got for k in want)
        for k in absent:
            assert k not in want and k not in got and got.get(k) is None
            with pytest.raises(KeyError):
                got[k]


@pytest.mark.parametrize("n", [0, 1, 5, SLICE - 1, SLICE, SLICE + 1, 3 * SLICE + 7])
def test_sorted_lookup_is_the_dict_with_repeats(n):
    rng = random.Random(n)
    keys = [f"k{rng.randrange(max(n // 3, 1))}" for _ in range(n)]  # most keys repeated
    _agree(keys, ["", "k", "zzz", "k-1", f"k{n}x"])


@pytest.mark.parametrize("name", ["qwen2", "llama-spm", "gemma-4", "deepseek-llm"])
def test_sorted_lookup_on_real_vocabularies(name):
    from llama_cpp_sdist import llama_cpp_dir

    with GGUFFile(llama_cpp_dir() / "models" / f"ggml-vocab-{name}.gguf") as g:
        tokens = g.metadata["tokenizer.ggml.tokens"]
        _agree(tokens, ["\x00never a token\x00", "Ġ" * 400])
        merges = g.metadata.get("tokenizer.ggml.merges")
        if merges is not None:
            _agree(merges, ["\x00 \x00"])


@pytest.mark.parametrize("n", [0, 5, SLICE - 1, SLICE, SLICE + 1, 20_000])
def test_sliced_dict_is_dict_of_zip(n):
    rng = random.Random(n)
    keys = [f"k{rng.randrange(max(n // 3, 1))}" for _ in range(n)]
    assert sliced_dict(keys, range(n)) == dict(zip(keys, range(n)))
    assert last_wins(keys) == dict(zip(keys, range(n)))
    assert first_wins(keys) == dict(zip(reversed(keys), range(n - 1, -1, -1)))


@pytest.mark.parametrize("bad", ["short", "long", "negative", "past_end", "unsorted"])
def test_an_order_that_does_not_fit_raises(bad):
    import array

    keys = [f"t{i:05d}" for i in range(5000)]
    order = array.array("i", range(5000))
    if bad == "short":
        order = order[:-1]
    elif bad == "long":
        order.append(0)
    elif bad == "negative":
        order[0] = -1
    elif bad == "past_end":
        order[997] = 5000
    else:
        order.reverse()
    with pytest.raises(OrderError):
        SortedLookup(keys, order.tobytes())


def test_an_entry_out_of_range_that_the_sample_missed_raises_order_error():
    import array

    keys = [f"t{i:05d}" for i in range(5000)]
    order = array.array("i", range(5000))
    order[2500] = 9999  # not a sampled entry (multiples of 997), in the first bisection probe
    lookup = SortedLookup(keys, order.tobytes())
    with pytest.raises(OrderError):
        lookup.get("t02500")
