"""gguf_file.py: agreement with the gguf package, malformed input (named cases) and the bounds on
hostile counts. The structure-aware fuzz run is tests/test_gguf_fuzz.py."""

import struct

import numpy as np
import pytest

from reflex_runtime.errors import ModelFileError
from reflex_runtime.modelfile.gguf_file import GGUFFile


def test_type_tables_match_the_gguf_package():
    import gguf
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

    from reflex_runtime.modelfile.ggml_types import GGML_TYPES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUF_VALUE_TYPES

    for t in GGML_TYPES.values():
        q = GGMLQuantizationType(t.type_id)
        assert q.name == t.name
        assert GGML_QUANT_SIZES[q] == (t.block_size, t.type_size)
    for vid, (name, _) in GGUF_VALUE_TYPES.items():
        assert GGUFValueType(vid).name == name
    assert GGUF_MAGIC == gguf.GGUF_MAGIC and GGUF_DEFAULT_ALIGNMENT == gguf.GGUF_DEFAULT_ALIGNMENT


def _as_python(v):
    if hasattr(v, "tolist"):
        return v.tolist()
    return v


@pytest.mark.parametrize("source", ["gemma3-fixture", "llama-spm-vocab"])
def test_metadata_tensors_and_data_match_gguf_reader(source, fixture_paths):
    import gguf
    from llama_cpp_sdist import llama_cpp_dir

    path = (str(fixture_paths("gemma3", "q4_k_m").gguf) if source == "gemma3-fixture"
            else str(llama_cpp_dir() / "models" / "ggml-vocab-llama-spm.gguf"))
    ours = GGUFFile(path)
    theirs = gguf.GGUFReader(path)
    assert set(ours.metadata) == {k for k in theirs.fields if not k.startswith("GGUF.")}
    for key, field in theirs.fields.items():
        if key.startswith("GGUF."):
            continue
        want = field.contents()
        got = _as_python(ours.metadata[key])
        if isinstance(want, float):
            assert got == pytest.approx(want, rel=1e-7)
        elif isinstance(want, list) and want and isinstance(want[0], float):
            np.testing.assert_allclose(got, want, rtol=1e-7)
        else:
            assert got == want, key
    assert len(ours.tensors) == len(theirs.tensors)
    for t in theirs.tensors:
        mine = ours.tensors[t.name]
        assert mine.shape == tuple(int(d) for d in t.shape) and mine.ggml_type == int(t.tensor_type)
        assert mine.offset == t.data_offset and mine.nbytes == t.n_bytes
        assert bytes(ours.tensor_data(t.name)) == t.data.tobytes()


# -- a small valid file to break -----------------------------------------------------------


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory):
    import gguf

    path = tmp_path_factory.mktemp("gguf") / "small.gguf"
    w = gguf.GGUFWriter(str(path), "qwen3")
    w.add_block_count(1)
    w.add_string("general.name", "small")
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "c", "dé"])
    w.add_array("tokenizer.ggml.scores", [0.5, 1.5, 2.5, 3.5])
    w.add_tensor("one.weight", np.arange(64, dtype=np.float32).reshape(2, 32))
    w.add_tensor("two.weight", np.ones((3, 32), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def _tensor_info_offsets(blob: bytes):
    """Byte offsets of (name, n_dims, dims, type, offset) fields of each tensor info."""
    from reflex_runtime.modelfile.gguf_file import _Cursor, _read_value

    out = []
    n_tensors, n_kv = struct.unpack_from("<QQ", blob, 8)
    # skip the KV section with our own reader (known good on this file)

    cur = _Cursor(blob, 24, len(blob))
    for _ in range(n_kv):
        cur.string()
        vt = cur.u32()
        _read_value(cur, vt)
    pos = cur.pos
    for _ in range(n_tensors):
        start = pos
        (ln,) = struct.unpack_from("<Q", blob, pos)
        pos += 8 + ln
        n_dims_at = pos
        (nd,) = struct.unpack_from("<I", blob, pos)
        pos += 4 + 8 * nd
        type_at = pos
        pos += 4
        off_at = pos
        pos += 8
        out.append({"start": start, "n_dims": n_dims_at, "type": type_at, "offset": off_at})
    return out


def _expect_error(tmp_path, blob: bytes, needle: str):
    p = tmp_path / "bad.gguf"
    p.write_bytes(blob)
    with pytest.raises(ModelFileError) as e:
        GGUFFile(p)
    msg = str(e.value)
    needles = needle if isinstance(needle, tuple) else (needle,)
    assert any(n in msg for n in needles), msg
    assert "\n" not in msg


def test_the_small_file_is_valid(small_gguf, tmp_path):
    p = tmp_path / "ok.gguf"
    p.write_bytes(small_gguf)
    g = GGUFFile(p)
    assert g.metadata["tokenizer.ggml.tokens"] == ["a", "b", "c", "dé"]
    assert list(g.metadata["tokenizer.ggml.scores"]) == [0.5, 1.5, 2.5, 3.5]
    assert np.frombuffer(g.tensor_data("one.weight"), dtype=np.float32).tolist() == list(range(64))


def test_named_malformations(small_gguf, tmp_path):
    b = bytearray(small_gguf)
    ti = _tensor_info_offsets(bytes(b))

    def patched(offset, fmt, value):
        c = bytearray(b)
        struct.pack_into(fmt, c, offset, value)
        return bytes(c)

    _expect_error(tmp_path, b"GGUX" + bytes(b[4:]), "not a GGUF file")
    _expect_error(tmp_path, patched(4, "<I", 1), "unsupported GGUF version 1")
    _expect_error(tmp_path, patched(4, "<I", 7), "unsupported GGUF version 7")
    _expect_error(tmp_path, patched(4, "<I", 0x03000000), "big-endian")
    _expect_error(tmp_path, bytes(b[:10]), "not a GGUF file")
    for cut in (40, 90, ti[0]["start"] + 3, ti[1]["offset"] + 2):
        _expect_error(tmp_path, bytes(b[:cut]), ("truncated", "cannot fit", "past the end"))
    _expect_error(tmp_path, bytes(b[:-8]), "runs past the end")
    _expect_error(tmp_path, patched(ti[1]["offset"], "<Q", 1 << 40), "runs past the end")
    _expect_error(tmp_path, patched(ti[1]["offset"], "<Q", 36), "not aligned")
    _expect_error(tmp_path, patched(ti[1]["offset"], "<Q", 0), "overlap")
    _expect_error(tmp_path, patched(ti[0]["type"], "<I", 99), "unknown ggml type id 99")
    _expect_error(tmp_path, patched(ti[0]["n_dims"], "<I", 5), "dimensions")
    _expect_error(tmp_path, patched(16, "<Q", 1 << 60), "count")  # n_kv
    _expect_error(tmp_path, patched(8, "<Q", 1 << 62), "count")  # n_tensors
    _expect_error(tmp_path, patched(24, "<Q", 1 << 50), "bytes long")  # first key's length


def test_missing_files_and_directories(tmp_path):
    with pytest.raises(ModelFileError, match="not found"):
        GGUFFile(tmp_path / "nope.gguf")
    with pytest.raises(ModelFileError, match="directory"):
        GGUFFile(tmp_path)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ModelFileError, match="not a GGUF"):
        GGUFFile(empty)


# -- bounds: hostile files whose counts fit in the file (the structured fuzz: test_gguf_fuzz.py) --


def _hostile(tmp_path, kvs: list[bytes], n_kv: int | None = None) -> str:
    """A GGUF header with these raw (key, type, value) entries and no tensors."""
    path = tmp_path / "hostile.gguf"
    path.write_bytes(struct.pack("<IIQQ", 0x46554747, 3, 0, len(kvs) if n_kv is None else n_kv) + b"".join(kvs))
    return str(path)


def _kv(key: str, vtype: int, payload: bytes) -> bytes:
    return struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", vtype) + payload


def _peak_mib(fn) -> float:
    import tracemalloc

    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak / 2**20


# case -> the most its parse may allocate before it is refused (MiB): a count or size over its
# bound is refused before anything is made; a file that stays within every count but not within
# the memory budget is refused when the budget (256 MiB, charged conservatively) runs out.
HOSTILE = {"2M tiny keys": 32, "2^17 tensors": 32, "3M strings": 32, "nested arrays": 32, "an array of 2^21 + 1": 32,
           "a 17 MiB string": 32, "a 64-byte tensor name": 32, "16k keys of 64 KB": 256, "two arrays of 1.5M strings": 256}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_counts_are_refused_before_allocating(tmp_path, case):
    """Each of these fits in its file; before the bounds, such files grew the process by
    0.8-1.3 GB. Now each is refused in well under a second, within HOSTILE[case] MiB."""
    import time

    u8 = struct.pack("<B", 1)
    if case == "2M tiny keys":
        path = _hostile(tmp_path, [_kv(f"{i:x}", 0, u8) for i in range(2_000_000)])
    elif case == "16k keys of 64 KB":
        path = _hostile(tmp_path, [_kv(f"{i:05d}" + "k" * 65000, 0, u8) for i in range(1100)], n_kv=16000)
    elif case == "two arrays of 1.5M strings":
        strings = struct.pack("<IQ", 8, 1_500_000) + (struct.pack("<Q", 2) + b"ab") * 1_500_000
        path = _hostile(tmp_path, [_kv("a", 9, strings), _kv("b", 9, strings)])
    elif case == "3M strings":
        path = _hostile(tmp_path, [_kv("a", 9, struct.pack("<IQ", 8, 3_000_000) + struct.pack("<Q", 0) * 3_000_000)])
    elif case == "nested arrays":
        inner = struct.pack("<IQ", 0, 1) + u8
        path = _hostile(tmp_path, [_kv("a", 9, struct.pack("<IQ", 9, 1_000_000) + inner * 1_000_000)])
    elif case == "an array of 2^21 + 1":
        path = _hostile(tmp_path, [_kv("a", 9, struct.pack("<IQ", 0, 2**21 + 1) + bytes(2**21 + 1))])
    elif case == "a 17 MiB string":
        path = _hostile(tmp_path, [_kv("a", 8, struct.pack("<Q", 17 << 20) + b"x" * (17 << 20))])
    elif case == "2^17 tensors":
        blob = struct.pack("<IIQQ", 0x46554747, 3, 2**17, 0) + (struct.pack("<Q", 1) + b"t" + struct.pack("<IQIQ", 1, 1, 0, 0)) * 2**17
        path = str(tmp_path / "t.gguf")
        open(path, "wb").write(blob)
    else:
        name = b"t" * 64
        blob = struct.pack("<IIQQ", 0x46554747, 3, 1, 0) + struct.pack("<Q", 64) + name + struct.pack("<IQIQ", 1, 8, 0, 0)
        path = str(tmp_path / "t.gguf")
        open(path, "wb").write(blob + bytes(64))
    t0 = time.perf_counter()
    with pytest.raises(ModelFileError) as e:
        GGUFFile(path)
    assert time.perf_counter() - t0 < 5.0
    assert "\n" not in str(e.value)
    peak = _peak_mib(lambda: pytest.raises(ModelFileError, GGUFFile, path))  # tracemalloc: ~10x slower
    assert peak < HOSTILE[case], f"{case}: {peak:.1f} MiB"


def test_the_budget_admits_a_file_near_it_and_its_charge_bounds_its_memory(tmp_path):
    """A million two-byte strings: charged ~107 MiB of the 256, so accepted; what they really
    take (tracemalloc) is below the charge."""
    n = 1_000_000
    path = _hostile(tmp_path, [_kv("a", 9, struct.pack("<IQ", 8, n) + (struct.pack("<Q", 2) + b"ab") * n)])
    box = {}
    peak = _peak_mib(lambda: box.update(g=GGUFFile(path)))
    g = box["g"]
    assert len(g.metadata["a"]) == n
    assert peak * 2**20 <= g.metadata_cost <= 256 << 20, (peak, g.metadata_cost / 2**20)


def test_real_vocabularies_fit_the_bounds_and_their_charge_bounds_their_memory():
    """llama.cpp's test vocabularies (up to Gemma 4's 262,144 tokens and 514,906 merges) open,
    and the parse's real peak (tracemalloc) is below what was charged."""
    from llama_cpp_sdist import llama_cpp_dir

    models = llama_cpp_dir() / "models"
    # the largest of each kind (tracemalloc makes a parse ~10x slower, so not all 19)
    for name in ("gemma-4", "command-r", "qwen2", "llama-spm"):
        path = str(models / f"ggml-vocab-{name}.gguf")
        box = {}
        peak = _peak_mib(lambda: box.update(g=GGUFFile(path)))
        g = box["g"]
        assert peak * 2**20 <= g.metadata_cost < 128 << 20, (path, peak, g.metadata_cost / 2**20)
        g.close()


def test_no_descriptor_outlives_its_file(small_gguf, tmp_path):
    """GGUFFile keeps its descriptor for read_tensor; a dropped object must not leak it."""
    import gc
    import os

    p = tmp_path / "ok.gguf"
    p.write_bytes(small_gguf)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(50):
        g = GGUFFile(p)
        assert bytes(g.read_tensor("two.weight")) == bytes(g.tensor_data("two.weight"))
        g.release_mapping()
        del g
    with GGUFFile(p):
        pass
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_copy_owns_its_descriptor(small_gguf, tmp_path):
    import copy
    import gc

    p = tmp_path / "ok.gguf"
    p.write_bytes(small_gguf)
    g = GGUFFile(p)
    c = copy.copy(g)
    c.metadata = {}
    del c
    gc.collect()  # the copy's close must not close the original's descriptor or mapping
    assert bytes(g.read_tensor("one.weight")) == bytes(g.tensor_data("one.weight"))
    assert "general.name" in g.metadata
    g.close()
