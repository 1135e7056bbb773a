"""gguf_file.py: agreement with the gguf package, and malformed input (named cases and a fuzz run)."""

import os
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from reflex_runtime.errors import ModelFileError, ReflexError
from reflex_runtime.gguf_file import GGUFFile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_type_tables_match_the_gguf_package():
    import gguf
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

    from reflex_runtime.ggml_types import GGML_TYPES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUF_VALUE_TYPES

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
    from reflex_runtime.gguf_file import _Cursor, _read_value

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


_FUZZ = textwrap.dedent(r"""
    import os, random, resource, signal, struct, sys
    from reflex_runtime.gguf_file import GGUFFile
    from reflex_runtime.errors import ReflexError

    src, work, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    blob = open(src, "rb").read()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    base_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # address space: what the interpreter already maps plus 1 GB; a bigger allocation fails loudly
    with open("/proc/self/statm") as f:
        vm_bytes = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (vm_bytes + (1 << 30), hard))

    def timeout(*_):
        raise TimeoutError("hang")

    signal.signal(signal.SIGALRM, timeout)
    rng = random.Random(1234)
    header_end = min(len(blob), int(sys.argv[4]))
    kinds = {"ok": 0, "reflex": 0}
    for i in range(n):
        b = bytearray(blob)
        kind = i % 5
        if kind == 0:                      # truncate anywhere
            b = b[: rng.randrange(len(b))]
        elif kind == 1:                    # flip bytes in the header / metadata / tensor infos
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(header_end)] ^= 1 << rng.randrange(8)
        elif kind == 2:                    # a huge count or length at a random place
            off = rng.randrange(0, header_end - 8)
            struct.pack_into("<Q", b, off, rng.choice([1 << 62, (1 << 64) - 1, 1 << 40, 1 << 31]))
        elif kind == 3:                    # a random 32-bit value (types, n_dims, value types)
            off = rng.randrange(0, header_end - 4)
            struct.pack_into("<I", b, off, rng.getrandbits(32))
        else:                              # random bytes over a span
            off = rng.randrange(header_end)
            span = rng.randint(1, 64)
            b[off:off + span] = bytes(rng.getrandbits(8) for _ in range(span))
        path = os.path.join(work, "fuzz.gguf")
        open(path, "wb").write(b)
        signal.alarm(2)
        try:
            g = GGUFFile(path)
            for name in list(g.tensors):
                g.tensor_data(name)
            g.close()
            kinds["ok"] += 1
        except ReflexError as e:
            if "MemoryError" in str(e):
                print(f"case {i}: allocation failed: {e}"); sys.exit(3)
            kinds["reflex"] += 1
        except TimeoutError:
            print(f"case {i}: hang"); sys.exit(4)
        except BaseException as e:
            print(f"case {i}: {type(e).__name__}: {e}"); sys.exit(5)
        finally:
            signal.alarm(0)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_kb) / 1024
    print(f"ok={kinds['ok']} reflex_errors={kinds['reflex']} rss_growth_mb={grown_mb:.1f}")
    sys.exit(0 if grown_mb < 1024 else 6)
""")


def test_fuzz_only_reflex_errors_no_hang_no_giant_allocation(small_gguf, tmp_path, fixture_paths):
    """Hundreds of corrupted copies of real GGUFs: a tiny hand-made one and a converter-made one."""
    real = fixture_paths("gemma3", "q8_0").gguf
    for name, blob in (("small", small_gguf), ("converted", real.read_bytes())):
        src = tmp_path / f"{name}.gguf"
        src.write_bytes(blob)
        g = GGUFFile(src)
        header_end = g.data_offset
        g.close()
        r = subprocess.run([sys.executable, "-c", _FUZZ, str(src), str(tmp_path), "300", str(header_end)],
                           capture_output=True, text=True, timeout=600, cwd=ROOT)
        assert r.returncode == 0, r.stdout + r.stderr
        ok, errs = [int(x.split("=")[1]) for x in r.stdout.split()[:2]]
        assert errs > 100, r.stdout  # most corruptions are caught, as ReflexError
        assert isinstance(ReflexError, type)
