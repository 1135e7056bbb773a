"""modelcache.py: the index round-trips a real vocabulary file, is stored in slices no longer than
PIECE items (marshal.loads holds the GIL for a whole call, and the cold path's device threads wait
on it), and anything stale, old or damaged is ignored (the file is parsed again)."""

import marshal
import os
import random

import pytest

from reflex_runtime.modelfile import modelcache
from reflex_runtime.modelfile.gguf_file import GGUFFile
from reflex_runtime.text.tokenizer import Tokenizer


@pytest.fixture()
def vocab(tmp_path, monkeypatch):
    """A copy of llama.cpp's Qwen2 test vocabulary (151,936 tokens, 151,387 merges) with its own
    index folder."""
    from llama_cpp_sdist import llama_cpp_dir

    src = llama_cpp_dir() / "models" / "ggml-vocab-qwen2.gguf"
    path = tmp_path / "vocab.gguf"
    path.write_bytes(src.read_bytes())
    monkeypatch.setenv("REFLEX_INDEX_DIR", str(tmp_path / "index"))
    monkeypatch.delenv("REFLEX_NO_INDEX", raising=False)
    return str(path)


def _index_file(tmp_path):
    (f,) = (tmp_path / "index").glob("*.marshal")
    return f


def test_round_trip_gives_the_parsed_file(vocab):
    parsed = GGUFFile(vocab)
    assert modelcache.load(vocab) is None
    assert modelcache.save(vocab, parsed, Tokenizer.from_gguf(parsed))
    index = modelcache.load(vocab)
    restored = GGUFFile(vocab, index=index["gguf"])
    assert restored.from_index
    assert restored.metadata == parsed.metadata
    assert restored.tensors == parsed.tensors
    assert (restored.version, restored.alignment, restored.data_offset) == (parsed.version, parsed.alignment,
                                                                            parsed.data_offset)
    text = "Hello world, 你好 — it's 2026!\n\tdef f(x): return x**2"
    fast = Tokenizer.from_gguf(restored).adopt_tables(index["tokenizer"])
    assert fast.encode(text) == Tokenizer.from_gguf(parsed).encode(text)
    assert type(fast._token_ids).__name__ == type(fast._ranks).__name__ == "SortedLookup"  # no dict built


def test_no_slice_holds_more_than_a_piece(vocab, tmp_path):
    g = GGUFFile(vocab)
    modelcache.save(vocab, g, Tokenizer.from_gguf(g))
    data = memoryview(_index_file(tmp_path).read_bytes())
    assert data[:len(modelcache.MAGIC)] == modelcache.MAGIC
    at = len(modelcache.MAGIC) + modelcache._HEAD
    size = int.from_bytes(data[len(modelcache.MAGIC):at], "little")
    head = marshal.loads(data[at:at + size])
    assert len(head["slices"]) >= 2 * 151_000 // modelcache.PIECE  # the tokens and the merges
    at += size
    for n in head["slices"]:
        piece = marshal.loads(data[at:at + n])
        assert 0 < len(piece) <= modelcache.PIECE
        at += n
    assert at == len(data)

    def longest(obj):  # no long list or dict stayed in the header (bytes load as one copy)
        inner = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
        own = len(obj) if isinstance(obj, (list, dict)) else 0
        return max([own, *map(longest, inner)])

    assert longest(head) <= modelcache.PIECE


@pytest.mark.parametrize("damage", ["stale", "format1", "truncated", "garbage", "empty"])
def test_a_stale_old_or_damaged_index_is_ignored(vocab, tmp_path, damage):
    g = GGUFFile(vocab)
    modelcache.save(vocab, g, Tokenizer.from_gguf(g))
    f = _index_file(tmp_path)
    if damage == "stale":  # the model file changed after the index was written
        st = os.stat(vocab)
        os.utime(vocab, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    elif damage == "format1":  # one marshal of the whole payload, as format 1 wrote it
        f.write_bytes(marshal.dumps({"ident": modelcache._key(vocab)[1], "gguf": modelcache.export_gguf(g)}, 4))
    elif damage == "truncated":
        f.write_bytes(f.read_bytes()[:-1000])
    elif damage == "garbage":
        f.write_bytes(modelcache.MAGIC + os.urandom(4096))
    else:
        f.write_bytes(b"")
    assert modelcache.load(vocab) is None
    assert GGUFFile(vocab).metadata == g.metadata  # and the file is simply parsed again


@pytest.mark.parametrize("n", [0, 1, modelcache.PIECE - 1, modelcache.PIECE, modelcache.PIECE + 1,
                               3 * modelcache.PIECE + 7])
def test_split_and_join_keep_order_and_nesting(n):
    rng = random.Random(n)
    payload = {
        "list": [f"t{rng.random()}" for _ in range(n)],
        "dict": {f"k{i}": i * 3 for i in range(n)},
        "nested": {"inner": list(range(n)), "small": [1, 2, 3], "lookalike": ["__slices__", "list", 5]},
        "array": ("__array__", "f", b"\0" * 8),
    }
    slices = []
    skeleton = modelcache._split(payload, slices)
    blob = memoryview(b"".join(slices))
    assert modelcache._join(skeleton, modelcache._Slices(blob, 0, [len(s) for s in slices])) == payload
    assert list(modelcache._join(skeleton, modelcache._Slices(blob, 0, [len(s) for s in slices]))["dict"]) == \
        list(payload["dict"])


def test_write_index_ahead_of_the_first_start(vocab, tmp_path):
    """What `reflex pull` and the image's build run: the next load finds the index; a file that
    does not parse writes none."""
    from reflex_runtime.loader import write_index

    assert write_index(vocab) and modelcache.load(vocab) is not None
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(64))
    assert not write_index(str(bad)) and modelcache.load(str(bad)) is None


def test_an_index_survives_file_times_cut_to_whole_seconds(vocab):
    """An image layer may keep file times in whole seconds only: an index baked beside the model
    must still match after a push and a pull."""
    g = GGUFFile(vocab)
    st = os.stat(vocab)
    os.utime(vocab, ns=(st.st_atime_ns, st.st_mtime_ns // 10**9 * 10**9 + 123_456_789))
    modelcache.save(vocab, g, Tokenizer.from_gguf(g))
    cut = os.stat(vocab).st_mtime_ns // 10**9 * 10**9
    os.utime(vocab, ns=(cut, cut))
    assert modelcache.load(vocab) is not None
